"""plugins/acl: topic access lists from a file, VerneMQ's vmq_acl plus Courier's tokens,
labels and per-label publish rate limits. Enabled by `[plugins.acl] enabled = true`;
see docs/plugins/acl.md.
"""

from plugins.acl.plugin import AclPlugin
from plugins.acl.rules import AclSyntaxError, Rule, RuleSet, parse

PLUGIN = AclPlugin

__all__ = ["PLUGIN", "AclPlugin", "AclSyntaxError", "Rule", "RuleSet", "parse"]
