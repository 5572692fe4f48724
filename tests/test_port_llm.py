"""`pallasopt port --llm`: a declined kernel goes to the model through the real anthropic SDK, answered by a loopback
HTTP server (no network, no key), then validated and checked by the oracle before it is written."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from pallasopt.port.llm_port import skeleton

FIX = Path(__file__).parent / "fixtures" / "triton"

KERNEL = """\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "ported"


def _row_sum(x_ref, o_ref):
    o_ref[...] = jnp.sum(x_ref[...], axis=-1, keepdims=True)


def ported(x):
    M, N = x.shape
    out = pl.pallas_call(
        _row_sum,
        grid=(M // 8,),
        in_specs=[pl.BlockSpec((8, N), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((M, 1), x.dtype),
    )(x)
    return out[:, 0]


"""


def _server(reply: str) -> tuple[HTTPServer, list[dict]]:
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body})
            data = json.dumps(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-test",
                    "content": [{"type": "text", "text": f"Here it is.\n```python\n{reply}```\n"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1200, "output_tokens": 300},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_llm_port_of_a_declined_kernel(tmp_path, monkeypatch, capsys):
    from pallasopt.cli import main
    from pallasopt.db.store import KernelDB
    from pallasopt.llm.client import request_key
    from pallasopt.port.llm_port import SYSTEM

    ref = FIX / "row_sums_ref.py"
    # the model keeps the reference part verbatim, as the system prompt asks
    reply = KERNEL + skeleton(str(ref), ref.read_text(), "row_sums").split("\n\n\n", 3)[3]
    server, seen = _server(reply)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    out, db = tmp_path / "row_sums.py", tmp_path / "k.db"
    args = ["port", str(FIX / "declines.py"), "--launcher", "row_sums", "--reference", str(ref), "--llm"]
    try:
        assert main([*args, "--db", str(db), "-o", str(out)]) == 0
    finally:
        server.shutdown()
    printed = capsys.readouterr().out
    assert "LLM attempt 1: ok" in printed and "LLM: 1 requests, 0 cached" in printed
    assert len(seen) == 1 and seen[0]["path"] == "/v1/messages"
    prompt = seen[0]["body"]["messages"][0]["content"]
    assert "def loop_kernel(" in prompt and "declines.py:34" in prompt and "a loop inside the kernel" in prompt
    assert "def make_inputs(key, M=64, N=256)" in prompt
    assert out.read_text() == reply
    body = seen[0]["body"]
    key = request_key(SYSTEM, prompt, model=body["model"], temperature=None, max_tokens=body["max_tokens"])
    with KernelDB.open(db) as store:  # the reply is cached under the request's key: a rerun makes no request
        row = store.llm_get(key)
    assert row is not None and "def _row_sum(" in row.reply


def test_llm_port_needs_a_key(tmp_path, monkeypatch, capsys):
    from pallasopt.cli import main

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    ref = FIX / "row_sums_ref.py"
    args = ["port", str(FIX / "declines.py"), "--launcher", "row_sums", "--reference", str(ref), "--llm"]
    assert main([*args, "-o", str(tmp_path / "o.py")]) == 4
    assert "--llm needs ANTHROPIC_API_KEY" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["no code here", "```python\nimport os\n```"])
def test_rejected_replies_are_retried_then_reported(bad):
    from pallasopt.llm.client import LLMReply
    from pallasopt.llm.session import LLMSession
    from pallasopt.port.llm_port import llm_port

    class Fake:
        calls = 0

        def complete(self, system, prompt, **kw):
            Fake.calls += 1
            return LLMReply(bad, 1, 1, "fake")

    ref = FIX / "row_sums_ref.py"
    partial = skeleton(str(ref), ref.read_text(), "row_sums")
    res = llm_port(LLMSession(client=Fake(), max_attempts=2), "declines.py", "src", partial, ["x: declined"], "o.py")
    assert res.source is None and Fake.calls == 2 and all(a.startswith("rejected: ") for a in res.attempts)
