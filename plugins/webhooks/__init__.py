"""plugins/webhooks: any hook served by HTTP endpoints, with VerneMQ's JSON (vmq_webhooks).

    [plugins.webhooks]
    enabled = true

    [[plugins.webhooks.endpoints]]
    hook = "auth_on_register"
    url = "http://127.0.0.1:8080/auth"

See docs/plugins/webhooks.md.
"""

from plugins.webhooks.plugin import EndpointConfig, WebhooksConfig, WebhooksPlugin

PLUGIN = WebhooksPlugin
Config = WebhooksConfig

__all__ = ["PLUGIN", "Config", "EndpointConfig", "WebhooksConfig", "WebhooksPlugin"]
