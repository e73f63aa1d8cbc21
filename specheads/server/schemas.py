"""Request bodies in the OpenAI shapes, plus two extensions: `top_k` and `speculation`.

Types and simple ranges are checked here (pydantic); limits that depend on the loaded
model (context length, tree size) are checked by the app, which knows them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr


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
    """Extension: `"speculation": {"enabled": false}` or lower tree knobs than the server's."""

    model_config = ConfigDict(extra="forbid")
    enabled: StrictBool = True
    method: StrictStr | None = None  # the server's method, or "off" / "ar" (= enabled false)
    num_steps: Int | None = Field(default=None, ge=1, le=1024)
    num_draft_tokens: Int | None = Field(default=None, ge=1, le=1 << 20)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    # unknown OpenAI fields (user, logit_bias, ...) are accepted and ignored, as other servers do
    model_config = ConfigDict(extra="allow")
    model: StrictStr
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


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[Int] | list[list[Int]]
    max_tokens: Int | None = Field(default=16, gt=0, lt=INT64)  # the OpenAI default for /v1/completions
