"""steerable.actors.models: real models as agents.

`OpenAIChatAgent` (extra `steerable[openai]`: OpenAI and any OpenAI-compatible server) and
`AnthropicAgent` (extra `steerable[anthropic]`) are async agents: `decide(view)` maps the
run's transcript to the provider's messages, sends one request on the runtime's event loop
(cancellable), and returns a decision. The pieces they are built from are public too, for
writing an adapter of your own: the message mappings, tool schemas, `ProviderError`.
Importing this module needs no SDK; constructing an adapter without its SDK raises
`ImportError` naming the extra. docs/models.md is the guide.
"""

from steerable.actors._tools.schema import (
    anthropic_tool,
    docstring_arguments,
    model_schema,
    openai_tool,
    strict_arguments,
    strict_compatible,
    strict_schema,
)

from ._anthropic import AnthropicAgent
from ._openai import OpenAIChatAgent
from .base import ModelAgent, ModelReply, ReplyToolCall
from .errors import ProviderError, classify_status, parse_retry_after, provider_error
from .mapping import (
    FINAL_TOOL,
    NOTE_PREFIX,
    ToolNames,
    anthropic_id,
    result_text,
    to_anthropic_messages,
    to_openai_messages,
)

__all__ = [
    "FINAL_TOOL",
    "NOTE_PREFIX",
    "AnthropicAgent",
    "ModelAgent",
    "ModelReply",
    "OpenAIChatAgent",
    "ProviderError",
    "ReplyToolCall",
    "ToolNames",
    "anthropic_id",
    "anthropic_tool",
    "classify_status",
    "docstring_arguments",
    "model_schema",
    "openai_tool",
    "parse_retry_after",
    "provider_error",
    "result_text",
    "strict_arguments",
    "strict_compatible",
    "strict_schema",
    "to_anthropic_messages",
    "to_openai_messages",
]
