"""Request bodies in the OpenAI shapes, plus two extensions: `top_k` and `speculation`.

Types and simple ranges are checked here (pydantic); limits that depend on the loaded
model (context length, tree size) are checked by the app, which knows them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationInfo,
                      field_validator)

from specheads.runtime.defaults import MAX_TOP_LOGPROBS


class APIError(Exception):
    """An error the client caused or must know about, in the OpenAI error shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


INT64 = 2**63
# ints, floats and bools are strict: `"max_tokens": true` or `"8"` is a 400, not 1 or 8
Int = StrictInt
Float = Annotated[StrictFloat, Field(allow_inf_nan=False)]


class SpeculationRequest(BaseModel):
    """Extension: `"speculation": {"enabled": false}` or lower tree knobs than the server's;
    `"enabled": "auto"` drafts while the request's acceptance (accepted / drafted, averaged over
    `window` steps) stays at or above `min_acceptance`, and probes again every `probe_every`
    steps without drafts."""

    model_config = ConfigDict(extra="forbid")
    enabled: StrictBool | Literal["auto"] = True
    min_acceptance: Float = Field(default=0.3, ge=0.0, le=1.0)
    window: Int = Field(default=8, ge=1, le=100_000)
    probe_every: Int = Field(default=32, ge=1, le=100_000)
    method: StrictStr | None = None  # the server's method, or "off" / "ar" (= enabled false)
    num_steps: Int | None = Field(default=None, ge=1, le=1024)
    num_draft_tokens: Int | None = Field(default=None, ge=1, le=1 << 20)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


# OpenAI fields this server accepts only at values that change nothing (what clients send by
# default); any other value is a 400 naming the field. Implemented options never appear here.
NO_OPS: dict[str, tuple] = {
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "store": (None, False),
    "modalities": (None, ["text"]),
    "service_tier": (None, "auto", "default"),
}


def _same(value, accepted) -> bool:
    # type-exact: `false` is not the `0` of presence_penalty, nor `true` the `1` of anything
    return value is accepted or (type(value) is type(accepted) and value == accepted)


class _Sampling(BaseModel):
    # a field this server does not know is a 400 naming it: a silently dropped option would
    # change what the client gets without telling it
    model_config = ConfigDict(extra="forbid")
    model: StrictStr
    user: StrictStr | None = None
    metadata: dict[str, StrictStr] | None = None
    max_tokens: Int | None = Field(default=None, gt=0, lt=INT64)
    temperature: Float = Field(default=1.0, ge=0, le=1e6)
    top_p: Float = Field(default=1.0, gt=0, le=1)
    top_k: Int = Field(default=0, ge=0, lt=INT64)  # the vocabulary bound is the app's (it knows the model)
    stop: StrictStr | list[StrictStr] | None = Field(default=None, max_length=16)
    seed: Int | None = Field(default=None, ge=-INT64, lt=INT64)  # a 64-bit integer, as OpenAI documents
    n: Int = Field(default=1, ge=1, lt=INT64)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    speculation: SpeculationRequest | None = None

    # the no-op fields (NO_OPS): declared so that a client's defaults pass, checked below
    echo: Any = None
    suffix: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    store: Any = None
    modalities: Any = None
    service_tier: Any = None

    @field_validator(*NO_OPS)
    @classmethod
    def _no_op(cls, value, info: ValidationInfo):
        accepted = NO_OPS[info.field_name]
        if not any(_same(value, a) for a in accepted):
            shown = ", ".join(json.dumps(a) for a in accepted)
            raise ValueError(f"{json.dumps(value)[:80]} is not supported by this server (accepted: {shown})")
        return value

    def top_logprobs_wanted(self) -> int | None:
        """None: no log-probabilities; k: each token's and the k most likely alternatives."""
        raise NotImplementedError

    def candidates(self) -> int:
        """Choices decoded (rows of the batch): n, or best_of where the endpoint has it."""
        return self.n

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class TextPart(BaseModel):
    """A content part; only text parts are served (an image part is a 400 naming its type)."""

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr | list[TextPart] | None = ""

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(default=None, gt=0, lt=INT64)
    logprobs: StrictBool | None = None
    top_logprobs: Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value, info: ValidationInfo):
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs \"logprobs\": true")
        return value

    def top_logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[Int] | list[list[Int]]
    max_tokens: Int | None = Field(default=16, gt=0, lt=INT64)  # the OpenAI default for /v1/completions
    logprobs: Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # the alternatives per token
    best_of: Int | None = Field(default=None, ge=1, lt=INT64)  # candidates decoded; the best n returned

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    def candidates(self) -> int:
        return self.best_of or self.n
