"""auth_jwt: a JWT in the CONNECT password decides who may connect (Courier's rule).

`[plugins.auth_jwt] enabled = true` with one key source (`secret`, `public_key_file` or
`jwks_url`); see docs/plugins/auth_jwt.md for every key, the token rules and the CONNACK
codes. The verified claims are left in `ctx.attributes["jwt_claims"]` for the acl plugin.
"""

from plugins.auth_jwt.plugin import AuthJwtConfig, AuthJwtPlugin

PLUGIN = AuthJwtPlugin

__all__ = ["PLUGIN", "AuthJwtConfig", "AuthJwtPlugin"]
