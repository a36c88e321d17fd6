"""plugins/auth_db: users and ACLs in a database, VerneMQ's vmq_diversity auth.

    [plugins.auth_db]
    enabled = true
    backend = "postgres"            # postgres | mysql | redis
    url = "postgresql://root:password@localhost:5432/vernemq_db"
    password_hash = "crypt"         # postgres: crypt | bcrypt; mysql: password | md5 |
                                    # sha1 | sha256 | bcrypt; redis: bcrypt

VerneMQ's table (vmq_auth_acl) and Redis keys, unchanged. See docs/plugins/auth_db.md.
"""

from plugins.auth_db.config import AuthDbConfig
from plugins.auth_db.plugin import AuthDbPlugin

PLUGIN = AuthDbPlugin

__all__ = ["PLUGIN", "AuthDbConfig", "AuthDbPlugin"]
