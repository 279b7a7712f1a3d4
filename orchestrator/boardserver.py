"""TensorBoard as `dsctl tensorboard` runs it: TensorBoard's own server and plugins, behind a token.

TensorBoard has no authentication, and a port on localhost is open to every user of the machine: any of them could
read a run's loss and cost curves, its run ids and its DSCTL_HOME path, around the 0600 files dsctl keeps them in.
So TensorBoard's WSGI application runs behind a gate that serves only requests carrying the board's token, as
Jupyter does: in the URL `dsctl tensorboard` prints (`?token=...`: answered with a cookie for that port and a
redirect to the same page without the token, so it leaves the address bar), or as an `Authorization: token ...`
header (scripts). Anything else gets 403 and one line that names nothing of the runs. The token and what to show
come in this process's environment (DSCTL_BOARD), which no other user can read, never on its command line, which
any user can.

    DSCTL_BOARD='{"token": "...", "logdir_spec": "run-a:/path,run-b:/path", "host": "localhost", "port": 6006}' \
        python -m dsctl.orchestrator.boardserver
"""

from __future__ import annotations

import hmac
import json
import os
import sys
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

BOARD_ENV = "DSCTL_BOARD"
REFUSED = (b"403 Forbidden: this TensorBoard serves only the user who started it. Open the URL that `dsctl tensorboard` "
           b"printed (with its ?token=...); `dsctl status` shows it again to that user.\n")

WSGIApp = Callable[[dict, Callable[..., Any]], Iterable[bytes]]


def cookie_name(port: int) -> str:
    """A cookie per port: cookies are per host, and two boards on one host must not take each other's."""
    return f"dsctl-tensorboard-{port}"


class TokenGate:
    """A WSGI application that passes on only the requests that carry `token` (query, cookie or header)."""

    def __init__(self, app: WSGIApp, token: str, port: int):
        self.app, self.token, self.cookie = app, token, cookie_name(port)

    def _ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.token.encode())

    def _from_cookie(self, environ: dict) -> str | None:
        try:
            morsel = SimpleCookie(environ.get("HTTP_COOKIE", "")).get(self.cookie)
        except CookieError:
            return None
        return morsel.value if morsel is not None else None

    @staticmethod
    def _from_header(environ: dict) -> str | None:
        scheme, _, value = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        return value.strip() if scheme.lower() in ("token", "bearer") else None

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and self._ok(given):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = environ.get("SCRIPT_NAME", "") + (environ.get("PATH_INFO") or "/") + (f"?{rest}" if rest else "")
            start_response("302 Found", [
                ("Location", location), ("Cache-Control", "no-store"), ("Content-Length", "0"),
                ("Set-Cookie", f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict")])
            return [b""]
        if self._ok(self._from_cookie(environ)) or self._ok(self._from_header(environ)):
            return self.app(environ, start_response)
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(REFUSED))), ("Cache-Control", "no-store")])
        return [REFUSED]


def main() -> None:
    config = json.loads(os.environ.pop(BOARD_ENV))
    token, port = config["token"], int(config["port"])
    from absl import app
    from tensorboard import default, main_lib, program

    class Gated(program.WerkzeugServer):
        def __init__(self, wsgi_app: WSGIApp, flags: Any):
            super().__init__(TokenGate(wsgi_app, token, port), flags)

    main_lib.global_init()
    board = program.TensorBoard(plugins=default.get_plugins(), server_class=Gated)
    argv = [sys.argv[0], "--logdir_spec", config["logdir_spec"], "--port", str(port), "--host", config["host"]]
    app.run(board.main, argv=argv, flags_parser=board.configure)


if __name__ == "__main__":
    main()
