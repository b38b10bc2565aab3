"""The wire between the sandbox and the host: errors, the JSON codec, op and result types.

`bridge` imports no other qjsflow package; everything else may import it.
"""

from qjsflow.bridge.codec import dumps, dumps_text, loads
from qjsflow.bridge.errors import CodecError, InvalidInput, QjsflowError, ToolchainError

__all__ = [
    "CodecError",
    "InvalidInput",
    "QjsflowError",
    "ToolchainError",
    "dumps",
    "dumps_text",
    "loads",
]
