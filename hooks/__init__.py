"""The plugin contract: VerneMQ's hooks, their contexts and results, and their dispatch.

A plugin is a class built from its config section; a hook is a method named after it:

    from hooks import NEXT, Error, Ok, PublishContext

    class OnlyOwnTopics:
        def auth_on_publish(self, ctx: PublishContext):
            if ctx.topic.startswith(f"devices/{ctx.client_id}/"):
                return Ok()
            return NEXT

A deciding hook answers Ok (allow, maybe with modifiers), Error (deny) or NEXT (no
opinion: ask the next plugin); returning None also means NEXT. An auth_on_publish answer
may say how long it holds (`cache_for`; `forget_decisions()` ends every such promise):
hooks/decisions.py. A plugin whose methods
break the contract (a misspelt hook name, a hook that does not take one context) stops
start-up with PluginError. Besides hooks, a plugin may have side doors, declared in
SIDE_DOORS and checked the same way: `start`/`stop`, `before_ack`, `metrics`,
`metadata`/`metadata_backend`, `invalidate`, `bridges` (a BridgeControl), `placement`,
`reload_tls` and `recorder` (a MessageRecorder). The broker resolves them once, when the
plugins load (`plugin_doors`: PluginDoors), and again when the admin API enables or
disables one. See docs/plugins.md for every hook, its context and the results it accepts,
and for the side doors.
"""

from hooks.bridges import BridgeControl
from hooks.decisions import FOREVER, forget_decisions
from hooks.dispatch import Chain, Hooks, PluginError, check_plugin
from hooks.recorder import MessageRecorder, RecordedClient, RecordedDelivery, RecordedMessage
from hooks.results import NEXT, Error, Next, Ok, Result
from hooks.side_doors import Lifecycle, PluginDoors, SideDoors, plugin_doors, side_doors
from hooks.spec import (
    HOOKS,
    SIDE_DOORS,
    AuthContext,
    ClientContext,
    HookSpec,
    MatchedAcl,
    Metric,
    PublishContext,
    RegisterContext,
    SideDoor,
    SubscribeContext,
    TopicRequest,
    UnsubscribeContext,
)

__all__ = [
    "FOREVER",
    "HOOKS",
    "NEXT",
    "SIDE_DOORS",
    "AuthContext",
    "BridgeControl",
    "Chain",
    "ClientContext",
    "Error",
    "HookSpec",
    "Hooks",
    "Lifecycle",
    "MatchedAcl",
    "MessageRecorder",
    "Metric",
    "Next",
    "Ok",
    "PluginDoors",
    "PluginError",
    "PublishContext",
    "RecordedClient",
    "RecordedDelivery",
    "RecordedMessage",
    "RegisterContext",
    "Result",
    "SideDoor",
    "SideDoors",
    "SubscribeContext",
    "TopicRequest",
    "UnsubscribeContext",
    "check_plugin",
    "forget_decisions",
    "plugin_doors",
    "side_doors",
]
