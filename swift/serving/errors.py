"""The error shape both servers answer with (OpenAI's), and the handlers that make every failure
take it: a bad request names its field (4xx); an unexpected failure is a 500 that names only the
exception's type and an incident id, while the server log keeps the rest (no exception text or
file paths reach a client)."""
from __future__ import annotations

import uuid

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from swift.utils.logging import get_logger
from swift.utils.registry import SwiftError

logger = get_logger(__name__)


class RequestError(SwiftError):
    """A bad request; the server answers with `status` and an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def internal_error(what: str, e: BaseException) -> RequestError:
    """A 500 for a failure that is not the request's: the client learns the exception's type and an
    incident id; the log has the message and traceback under the same id."""
    incident = uuid.uuid4().hex[:12]
    logger.error(f"{what} failed (incident {incident}): {type(e).__name__}: {e}", exc_info=e)
    return RequestError(f"{what} failed: {type(e).__name__} (incident {incident}; see the server log)", status=500,
                        code="internal_error")


def add_error_handlers(app: FastAPI, name: str) -> None:
    """RequestError → its status; any other exception → internal_error; unknown routes and wrong
    methods → 404/405, all in the same JSON shape."""

    @app.exception_handler(RequestError)
    async def request_error(_, e: RequestError):
        return error(e)

    @app.exception_handler(Exception)
    async def server_error(_, e: Exception):
        return error(internal_error(name, e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):
        return error(RequestError(str(e.detail), status=e.status_code))
