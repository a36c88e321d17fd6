"""MQTT 5 enhanced authentication [4.12]: the AUTH exchange, driven by on_auth_m5.

A CONNECT with an Authentication Method starts an exchange; each step asks the on_auth_m5
chain, which answers Ok with a `reason_code` modifier (0: success, 0x18: continue, with
the server's next challenge in `properties`) or Error. The same steps serve
re-authentication (AUTH 0x19) on an established connection. Properties in the modifiers
are keyed by `broker.protocol.Property` (ints).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.protocol import Property, ReasonCode
from hooks import AuthContext, Chain, Error, Ok

SUCCESS = ReasonCode.SUCCESS
CONTINUE = ReasonCode.CONTINUE_AUTHENTICATION


@dataclass(slots=True)
class AuthStep:
    reason_code: int  # SUCCESS, CONTINUE, or a refusal (0x80 and up)
    properties: dict = field(default_factory=dict)  # to send: method, data, ...


class AuthExchange:
    """One connection's authentication method and the chain that judges it."""

    __slots__ = ("chain", "method")

    def __init__(self, chain: Chain, method: str) -> None:
        self.chain = chain
        self.method = method

    async def step(self, context: AuthContext, data: bytes | None) -> AuthStep:
        context.properties = {Property.AUTHENTICATION_METHOD: self.method}
        if data is not None:
            context.properties[Property.AUTHENTICATION_DATA] = data
        result = await self.chain.run(context)
        if type(result) is not Ok:
            code = result.reason_code if type(result) is Error else None
            return AuthStep(code if code and code >= 0x80 else ReasonCode.NOT_AUTHORIZED)
        code = result.modifiers.get("reason_code", SUCCESS)
        if code not in (SUCCESS, CONTINUE):
            return AuthStep(code if code >= 0x80 else ReasonCode.NOT_AUTHORIZED)
        properties = {Property.AUTHENTICATION_METHOD: self.method}
        properties.update(result.modifiers.get("properties", {}))
        return AuthStep(code, properties)
