"""The LLM rewrite pass, offline: recorded replies (tests/fixtures/llm), validation, isolation, self-debug, cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from pallasopt.errors import PassNotApplicable, UsageError
from pallasopt.ir.facts import CallFacts
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.llm.client import (
    AnthropicClient,
    LLMReply,
    RecordedClient,
    Recording,
    RecordingClient,
    UnrecordedRequest,
    cost_usd,
    request_key,
)
from pallasopt.llm.isolated import from_plain, ir_from_source_isolated, static_dims
from pallasopt.llm.prompt import SYSTEM
from pallasopt.llm.rewrite import normalize_error, rewrite
from pallasopt.llm.session import current_session, llm_session
from pallasopt.llm.strategies import STRATEGIES, applicable, get_strategy
from pallasopt.llm.validate import ReplyFormatError, extract_module, validate
from pallasopt.passes.llm_rewrite import NO_SESSION, LLMRewritePass

FIXTURES = ROOT / "tests" / "fixtures" / "llm"
SOFTMAX = ROOT / "examples" / "softmax.py"
MATMUL = ROOT / "examples" / "matmul.py"


def recorded(name: str) -> RecordedClient:
    return RecordedClient.from_file(FIXTURES / name)


def reply_code(name: str) -> str:
    return extract_module((FIXTURES / name).read_text())


def no_checker(source: str, path: str):
    raise AssertionError("the oracle must not run for a reply that fails earlier")


@pytest.fixture(scope="module")
def softmax_ir() -> KernelIR:
    return KernelIR.from_file(SOFTMAX)


@pytest.fixture(scope="module")
def matmul_ir() -> KernelIR:
    return KernelIR.from_file(MATMUL)


@pytest.fixture
def db(tmp_path: Path):
    from pallasopt.db.store import KernelDB

    with KernelDB.open(tmp_path / "kernels.db") as handle:
        yield handle


@pytest.fixture
def parent_never_runs_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the main process loads any module source while the fixture is active (request it after
    the fixtures that load the original kernels)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("candidate code was executed in the main process")

    monkeypatch.setattr("pallasopt.workload.exec_module", refuse)
    monkeypatch.setattr("pallasopt.workload.load_source", refuse)
    monkeypatch.setattr("pallasopt.ir.kernel_ir.load_source", refuse)


# ------------------------------------------------------------------------------------------------- the pass


def test_no_session_declines_with_one_line(softmax_ir: KernelIR) -> None:
    assert current_session() is None
    with pytest.raises(PassNotApplicable) as e:
        LLMRewritePass("online-softmax").apply(softmax_ir)
    assert e.value.reason == NO_SESSION
    assert LLMRewritePass.choices(softmax_ir, _chip()) == ()


def test_choices_only_inside_a_session(softmax_ir: KernelIR) -> None:
    with llm_session(RecordedClient([])):
        specs = [p.spec() for p in LLMRewritePass.choices(softmax_ir, _chip())]
    assert specs == ["llm-rewrite{strategy=online-softmax}", "llm-rewrite{strategy=mxu-reduction}"]
    assert current_session() is None
    assert LLMRewritePass.from_params({"strategy": "fuse-epilogue"}) == LLMRewritePass("fuse-epilogue")
    with pytest.raises(UsageError, match="unknown strategy"):
        LLMRewritePass.from_params({"strategy": "make-it-fast"})


def test_strategy_that_does_not_apply_declines_without_a_request(softmax_ir: KernelIR) -> None:
    client = RecordedClient([])
    with llm_session(client), pytest.raises(PassNotApplicable, match="does not apply"):
        LLMRewritePass("accumulate-f32-scratch").apply(softmax_ir)
    assert client.calls == 0


@pytest.mark.slow
def test_good_rewrite_is_verified_and_cached(softmax_ir: KernelIR, db, parent_never_runs_candidates) -> None:
    client = recorded("softmax_good.json")
    with llm_session(client, db, model="claude-sonnet-4-5") as session:
        new = LLMRewritePass("online-softmax").apply(softmax_ir)
    assert client.calls == 1
    assert new.source == reply_code("softmax_online_good.md")
    assert new.recipe == ("llm-rewrite{strategy=online-softmax}",)
    assert new.workload is None and new.entry == "softmax" and dict(new.dims) == dict(softmax_ir.dims)
    assert new.calls[0].grid == softmax_ir.calls[0].grid and "scan" in new.calls[0].body.primitives
    usage = session.usage()
    assert usage.requests == 1 and usage.cache_hits == 0
    assert usage.input_tokens > 1000 and usage.output_tokens > 100
    assert usage.cost_usd == pytest.approx(cost_usd("claude-sonnet-4-5", usage.input_tokens, usage.output_tokens))

    # The same run again: every request is served from the database, none reaches the client.
    silent = RecordedClient([])
    with llm_session(silent, db, model="claude-sonnet-4-5") as again:
        same = LLMRewritePass("online-softmax").apply(softmax_ir)
    assert silent.calls == 0 and silent.requests == []
    assert same.source == new.source
    assert again.usage().requests == 0 and again.usage().cache_hits == 1 and again.usage().cost_usd == 0.0


@pytest.mark.slow
def test_matmul_rewrite_with_f32_scratch(matmul_ir: KernelIR, parent_never_runs_candidates) -> None:
    client = recorded("matmul_scratch.json")
    with llm_session(client):
        new = LLMRewritePass("accumulate-f32-scratch").apply(matmul_ir)
    (call,) = new.calls
    assert [(s.shape, s.dtype) for s in call.scratch] == [((128, 128), "float32")]
    assert call.dimension_semantics == ("parallel", "parallel", "arbitrary")
    assert "accumulate-f32-scratch" not in [s.name for s in applicable(new)]


def test_reply_that_edits_the_reference_is_rejected(softmax_ir: KernelIR) -> None:
    client = recorded("softmax_edits_reference.json")
    with llm_session(client, max_attempts=1, checker=no_checker) as session:
        with pytest.raises(PassNotApplicable) as e:
            LLMRewritePass("online-softmax").apply(softmax_ir)
        assert "`reference` was changed" in e.value.reason
        assert e.value.reason.startswith("online-softmax: attempts exhausted after 1 attempt(s): validation failed")
        assert session.tried(softmax_ir.digest) == (e.value.reason,)
    assert client.calls == 1


def test_later_requests_say_what_was_tried(softmax_ir: KernelIR) -> None:
    unchanged = "No gain here.\n\n```python\n" + softmax_ir.source + "```\n"
    later = Recording(("Strategy: mxu-reduction", "Already tried on this kernel", "`reference` was changed"), unchanged)
    client = recorded("softmax_edits_reference.json")
    client.recordings = [*client.recordings, later]
    with llm_session(client, max_attempts=1, checker=no_checker):
        for strategy in ("online-softmax", "mxu-reduction"):
            with pytest.raises(PassNotApplicable):
                LLMRewritePass(strategy).apply(softmax_ir)
    assert client.calls == 2


@pytest.mark.slow
def test_self_debug_fixes_a_wrong_reply(softmax_ir: KernelIR) -> None:
    client = recorded("softmax_self_debug.json")
    with llm_session(client) as session:
        out = rewrite(softmax_ir, get_strategy("online-softmax"), session, "llm-rewrite{strategy=online-softmax}")
    assert out.stop == "verified" and out.ir is not None
    assert out.ir.source == reply_code("softmax_online_fixed.md")
    (failed,) = out.attempts
    assert failed.stage == "correctness" and failed.error.startswith("mismatch")
    assert client.calls == 2
    retry = client.requests[1]
    assert "Attempt 2 of 3" in retry and failed.error[:80] in retry
    assert "        s = s + jnp.sum(jnp.exp(x - m_new), axis=-1, keepdims=True)" in retry  # the code that failed


def test_repeated_error_stops_the_loop(softmax_ir: KernelIR) -> None:
    client = recorded("softmax_repeated_error.json")  # only two recordings: a third request would raise
    with llm_session(client, max_attempts=3, checker=no_checker) as session:
        out = rewrite(softmax_ir, get_strategy("online-softmax"), session, "llm-rewrite{strategy=online-softmax}")
    assert out.ir is None and out.stop == "repeated error"
    assert [a.stage for a in out.attempts] == ["validation", "validation"]
    assert "`TOLERANCE` was added" in out.attempts[0].error
    assert client.calls == 2
    assert out.reason().startswith("repeated error after 2 attempt(s): validation failed")


def test_candidate_runs_only_in_the_child(softmax_ir: KernelIR, parent_never_runs_candidates) -> None:
    client = recorded("softmax_raises_on_import.json")
    with llm_session(client, max_attempts=1, checker=no_checker) as session:
        out = rewrite(softmax_ir, get_strategy("online-softmax"), session, "x")
    (failed,) = out.attempts
    assert failed.stage == "trace"
    assert "RuntimeError: module-level code ran at import" in failed.error


def test_request_budget(softmax_ir: KernelIR) -> None:
    client = recorded("softmax_good.json")
    with llm_session(client, max_requests=0), pytest.raises(PassNotApplicable, match="budget of 0 LLM requests"):
        LLMRewritePass("online-softmax").apply(softmax_ir)
    assert client.calls == 0


def test_unchanged_reply_stops_without_tracing(softmax_ir: KernelIR) -> None:
    text = "This kernel is already optimal for the strategy.\n\n```python\n" + softmax_ir.source + "```\n"
    client = RecordedClient([Recording(("Strategy: mxu-reduction",), text)])
    with llm_session(client, checker=no_checker) as session:
        out = rewrite(softmax_ir, get_strategy("mxu-reduction"), session, "x")
    assert out.stop == "unchanged" and client.calls == 1


# ------------------------------------------------------------------------------------------------ validation

ORIGINAL = SOFTMAX.read_text()
GOOD = reply_code("softmax_online_good.md")
KERNEL_LINE = "        x = x_ref[:, pl.ds(pl.multiple_of(c * LANES, LANES), LANES)]\n"


def edit(old: str, new: str, source: str = GOOD) -> str:
    assert old in source, old
    return source.replace(old, new, 1)


BAD = {
    "reference changed": (edit("jax.nn.softmax(x, axis=-1)", "jax.nn.softmax(x, axis=1)"), "`reference` was changed"),
    "make_inputs changed": (edit("R=8192, C=2048", "R=8192, C=1024"), "`make_inputs` was changed"),
    "CHECK_DIMS changed": (edit('"R": 64', '"R": 32'), "`CHECK_DIMS` was changed"),
    "TOLERANCE added": (GOOD + 'TOLERANCE = {"rtol": 1.0, "atol": 1.0}\n', "`TOLERANCE` was added"),
    "reference rebound": (GOOD + "reference = softmax\n", "`reference` was changed"),
    "reference imported": (edit("import jax\n", "import jax\nfrom softmax import reference\n"), "never import"),
    "own module imported": (edit("import jax\n", "import jax\nimport softmax as orig\n"), "the kernel's own module"),
    "os imported": (edit("import jax\n", "import jax\nimport os\n"), "imports 'os'"),
    "entry calls the oracle": (
        edit("    rows, cols = x.shape\n    return", "    rows, cols = x.shape\n    return reference(x)\n    return"),
        "must not call the oracle",
    ),
    "entry renamed": (GOOD.replace("def softmax(x):", "def fast_softmax(x):"), "the entry is now"),
    "no pallas_call": (GOOD.replace("pl.pallas_call(", "jax.jit("), "not a valid kernel module"),
    "interpret": (
        edit(
            "out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),",
            "out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),\n        interpret=True,",
        ),
        "sets interpret=",
    ),
    "file read": (edit(KERNEL_LINE, KERNEL_LINE + '        open("/etc/passwd").read()\n'), "calls open()"),
    "np.load": (
        edit("import jax\n", "import jax\nimport numpy as np\n").replace(
            KERNEL_LINE, KERNEL_LINE + '        np.load("x.npy")\n'
        ),
        "uses .load",
    ),
    "dunder": (edit(KERNEL_LINE, KERNEL_LINE + "        jax.__dict__\n"), "dunder attribute"),
    "global cache": (
        edit("def softmax(x):\n", "_LAST = None\n\n\ndef softmax(x):\n    global _LAST\n"),
        "`global _LAST`",
    ),
    "dict cache": (
        edit(
            "def softmax(x):\n    rows, cols = x.shape\n",
            "_SEEN = {}\n\n\ndef softmax(x):\n    rows, cols = x.shape\n    _SEEN[x.shape] = x\n",
        ),
        "writes into module-level `_SEEN`",
    ),
    "list append": (
        edit(
            "def softmax(x):\n    rows, cols = x.shape\n",
            "_SEEN = []\n\n\ndef softmax(x):\n    rows, cols = x.shape\n    _SEEN.append(x)\n",
        ),
        "mutates module-level `_SEEN`",
    ),
    "lru_cache": (
        edit("import jax\n", "import functools\n\nimport jax\n").replace(
            "def softmax(x):", "@functools.lru_cache\ndef softmax(x):"
        ),
        "@lru_cache caches",
    ),
    "syntax": (GOOD.replace("def softmax(x):", "def softmax(x)"), "syntax error at line"),
}


@pytest.mark.parametrize("name", BAD)
def test_validation_rejects(name: str) -> None:
    source, expected = BAD[name]
    reasons = validate(ORIGINAL, source, str(SOFTMAX))
    assert any(expected in r for r in reasons), reasons


def test_validation_accepts_ordinary_code() -> None:
    assert validate(ORIGINAL, GOOD, str(SOFTMAX)) == ()
    assert validate(MATMUL.read_text(), reply_code("matmul_f32_scratch.md"), str(MATMUL)) == ()
    local_state = edit(
        "def softmax(x):\n    rows, cols = x.shape\n",
        "SIZES = {8: 1}\n\n\ndef softmax(x):\n    rows, cols = x.shape\n    seen = {}\n    seen[rows] = SIZES[8]\n"
        "    y = jnp.add(x, 0.0)\n    del y\n",
    )
    assert validate(ORIGINAL, local_state, str(SOFTMAX)) == ()
    # A construct the user's own module already has is not held against the rewrite.
    cached = edit("import jax\n", "import functools\n\nimport jax\n", ORIGINAL).replace(
        "def softmax(x):", "@functools.lru_cache\ndef _unused(n):\n    return n\n\n\ndef softmax(x):"
    )
    assert validate(cached, cached.replace("return n\n", "return n + 0\n"), str(SOFTMAX)) == ()


def test_names_the_oracle_uses_are_protected() -> None:
    original = edit("ROWS_PER_BLOCK = 8\n", "ROWS_PER_BLOCK = 8\nTEMP = 1.0\n", ORIGINAL).replace(
        "jax.nn.softmax(x, axis=-1)", "jax.nn.softmax(x * TEMP, axis=-1)"
    )
    assert validate(original, original.replace("TEMP = 1.0", "TEMP = 2.0"), str(SOFTMAX)) == (
        "`TEMP` (used by `reference`) was changed: it must stay byte-identical to the original",
    )
    # Another import that binds `jax` does not change what `jax` (used by reference) is.
    more_imports = edit("import jax\n", "import jax\nimport jax.experimental.pallas\n", original)
    assert validate(original, more_imports, str(SOFTMAX)) == ()


def test_reply_format() -> None:
    assert extract_module("x\n```python\nimport jax\n```\ny") == "import jax\n"
    assert extract_module("```\nimport jax\n```") == "import jax\n"
    with pytest.raises(ReplyFormatError, match="no ```python"):
        extract_module("I would use a bigger block.")
    with pytest.raises(ReplyFormatError, match="2 python code blocks"):
        extract_module("```python\na = 1\n```\nand\n```python\nb = 2\n```")


def test_normalize_error_ignores_numbers_and_paths() -> None:
    a = "mismatch seed 101: output 0: 1021/16384 elements outside rtol=0.001 (max abs err 0.596) at /a/k.py:12"
    b = "mismatch seed 101: output 0: 998/16384 elements outside rtol=0.001 (max abs err 0.61) at /b/k.py:40"
    assert normalize_error(a) == normalize_error(b)
    assert normalize_error(a) != normalize_error("nan: output 0 has NaN")


# --------------------------------------------------------------------------------------- isolation and facts


def test_facts_round_trip_through_dicts(example_irs: dict[str, KernelIR]) -> None:
    for ir in example_irs.values():
        for call in ir.calls:
            back = from_plain(CallFacts, json.loads(json.dumps(call.to_dict())))
            assert back == call


def test_isolated_ir_matches_in_process_trace(softmax_ir: KernelIR, parent_never_runs_candidates) -> None:
    iso = ir_from_source_isolated(softmax_ir.source, softmax_ir.path, ("r",))
    assert iso.calls == softmax_ir.calls
    assert dict(iso.dims) == {"R": 8192, "C": 2048} and iso.entry == "softmax" and iso.recipe == ("r",)
    assert iso.workload is None and iso.module.code == softmax_ir.source


def test_static_dims() -> None:
    assert static_dims("def make_inputs(key, M=4 * 1024, N=2**11, dtype=None, *, K=512):\n    pass\n") == {
        "M": 4096,
        "N": 2048,
        "K": 512,
    }


# ----------------------------------------------------------------------------------------- clients and menu


def test_recorded_client_refuses_unrecorded_requests() -> None:
    client = RecordedClient([Recording(("Strategy: a",), "reply")])
    kw = {"model": "m", "temperature": None, "max_tokens": 10}
    assert client.complete("s", "Strategy: a\n", **kw).text == "reply"
    with pytest.raises(UnrecordedRequest, match="Strategy: a"):
        client.complete("s", "Strategy: a\n", **kw)  # served once only
    assert client.calls == 1


def test_recording_client_writes_a_manifest_the_recorded_client_serves(tmp_path: Path) -> None:
    inner = RecordedClient([Recording(("Strategy: x",), "```python\na = 1\n```", 10, 5, "claude-haiku-4-5")])
    manifest = tmp_path / "rec.json"
    prompt = "Strategy: x\nAttempt 1 of 3\nbody"
    RecordingClient(inner, manifest).complete("s", prompt, model="m", temperature=None, max_tokens=9)
    again = RecordedClient.from_file(manifest).complete("s", prompt, model="m", temperature=None, max_tokens=9)
    assert again == LLMReply("```python\na = 1\n```", 10, 5, "claude-haiku-4-5")


def test_anthropic_client_request_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import anthropic

    sent: dict[str, object] = {}

    class FakeMessages:
        def create(self, **kwargs: object) -> object:
            sent.update(kwargs)
            block = types.SimpleNamespace(type="text", text="hi")
            usage = types.SimpleNamespace(input_tokens=12, output_tokens=3)
            return types.SimpleNamespace(
                content=[block], usage=usage, model="claude-sonnet-4-5", stop_reason="end_turn"
            )

    class FakeAnthropic:
        def __init__(self, **kwargs: object) -> None:
            self.messages = FakeMessages()

    monkeypatch.setattr(anthropic, "Anthropic", FakeAnthropic)
    client = AnthropicClient("key")
    reply = client.complete("sys", "p", model="claude-sonnet-4-5", temperature=0.5, max_tokens=100)
    assert reply == LLMReply("hi", 12, 3, "claude-sonnet-4-5")
    assert sent["system"] == "sys" and sent["messages"] == [{"role": "user", "content": "p"}]
    assert sent["extra_body"] == {"temperature": 0.5} and "temperature" not in sent
    client.complete("sys", "p", model="claude-sonnet-4-5", temperature=None, max_tokens=100)
    assert sent["extra_body"] is None


def test_prices_and_cache_key() -> None:
    assert cost_usd("claude-sonnet-4-5-20250929", 1_000_000, 1_000_000) == pytest.approx(18.0)
    assert cost_usd("claude-haiku-4-5", 2_000_000, 0) == pytest.approx(2.0)
    assert cost_usd("some-other-model", 10, 10) is None
    k = request_key(SYSTEM, "p", model="m", temperature=None, max_tokens=1)
    assert k == request_key(SYSTEM, "p", model="m", temperature=None, max_tokens=1)
    assert k != request_key(SYSTEM, "p", model="m", temperature=None, max_tokens=2)


def test_strategy_menu(example_irs: dict[str, KernelIR]) -> None:
    names = [s.name for s in STRATEGIES]
    assert len(names) == len(set(names)) == 9
    assert all(s.what and s.when and s.requires for s in STRATEGIES)
    got = {k: [s.name for s in applicable(ir)] for k, ir in example_irs.items()}
    assert "online-softmax" in got["softmax"] and "online-softmax" in got["attention"]
    assert "attention-blocking" in got["attention"] and "attention-blocking" not in got["softmax"]
    assert got["matmul"] == ["accumulate-f32-scratch"]
    assert "hoist-invariant" in got["rmsnorm"]
    assert got["elementwise"] == []


def _chip():
    from pallasopt.cost_model.hardware import get_chip

    return get_chip("v5e")
