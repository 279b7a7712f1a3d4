"""`dsctl tensorboard` serves only requests that carry its token (orchestrator/boardserver.py), as Jupyter does: the
gate itself, as a WSGI application in front of a stand-in for TensorBoard's. Through a real TensorBoard and another
local user: tests/test_tensorboard_events.py."""

from __future__ import annotations

from dsctl.orchestrator.boardserver import REFUSED, TokenGate, cookie_name

TOKEN = "s3cret-token_value"


def tensorboard(environ, start_response):
    start_response("200 OK", [("Content-Type", "application/json")])
    return [b'{"fit-a/.": ["loss"]}']


def call(path: str = "/", query: str = "", **headers) -> tuple[str, dict, bytes]:
    seen: dict = {}

    def start_response(status, response_headers):
        seen["status"], seen["headers"] = status, dict(response_headers)

    environ = {"PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": "",
               **{f"HTTP_{k.upper()}": v for k, v in headers.items()}}
    body = b"".join(TokenGate(tensorboard, TOKEN, 6006)(environ, start_response))
    return seen["status"], seen["headers"], body


def test_without_the_token_nothing_of_the_runs_is_served():
    for query, headers in (("", {}), ("token=wrong", {}), ("token=", {}), ("", {"authorization": "token nope"}),
                           ("", {"cookie": f"{cookie_name(6007)}={TOKEN}"}),  # another board's cookie
                           ("", {"cookie": f"{cookie_name(6006)}=nope"})):
        status, _, body = call("/data/plugin/scalars/tags", query, **headers)
        assert status.startswith("403") and body == REFUSED and b"fit-a" not in body, (query, headers)


def test_the_printed_url_sets_a_cookie_for_this_port_and_drops_the_token_from_the_address():
    status, headers, _ = call("/", f"token={TOKEN}&darkMode=true")
    assert status.startswith("302") and headers["Location"] == "/?darkMode=true"
    assert headers["Set-Cookie"] == f"{cookie_name(6006)}={TOKEN}; Path=/; HttpOnly; SameSite=Strict"
    status, _, body = call("/data/plugin/scalars/tags", cookie=f"other=1; {cookie_name(6006)}={TOKEN}")
    assert status == "200 OK" and b"fit-a" in body


def test_a_script_may_send_the_token_in_a_header():
    for scheme in ("token", "Token", "Bearer"):
        status, _, body = call("/data/plugin/scalars/tags", authorization=f"{scheme} {TOKEN}")
        assert status == "200 OK" and b"fit-a" in body
