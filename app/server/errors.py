"""The API's errors, answered with OpenAI's error body."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from app.server import responses as R


class ApiError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.code, self.headers = param, code, headers

    def response(self) -> JSONResponse:
        body = R.error_body(self.message, self.kind, self.param, self.code)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def unavailable(message: str, retry_after: float, code: str = "engine_unavailable") -> ApiError:
    """A 503 saying why the engine cannot answer now, and when to try again."""
    return ApiError(
        503,
        message,
        "server_error",
        code=code,
        headers={"Retry-After": str(max(1, round(retry_after)))},
    )
