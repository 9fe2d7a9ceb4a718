"""The operator console: web pages over the same commands as `idempotent-workers dlq`.

`idempotent-workers console` serves it; `idempotent-workers console token
create --name N --role read|operator` makes the token that signs in.
"""

from console.app import create_app
from console.settings import ConsoleSettings
from console.tokens import Operator, Role, Tokens

__all__ = ["ConsoleSettings", "Operator", "Role", "Tokens", "create_app"]
