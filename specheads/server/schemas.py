"""Request bodies in the OpenAI shapes, plus two extensions: `top_k` and `speculation`.

Types and simple ranges are checked here (pydantic); limits that depend on the loaded
model (context length, tree size) are checked by the app, which knows them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class APIError(Exception):
    """An error the client caused or must know about, in the OpenAI error shape."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class SpeculationRequest(BaseModel):
    """Extension: `"speculation": {"enabled": false}` or lower tree knobs than the server's."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    method: str | None = None  # the server's method, or "off" / "ar" (= enabled false)
    num_steps: int | None = Field(default=None, ge=1)
    num_draft_tokens: int | None = Field(default=None, ge=1)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    # unknown OpenAI fields (user, logit_bias, ...) are accepted and ignored, as other servers do
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculation: SpeculationRequest | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict] | None = ""

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: only text ones carry meaning here
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, gt=0)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, gt=0)  # the OpenAI default for /v1/completions
