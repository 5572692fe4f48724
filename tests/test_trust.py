"""Per-family tier trust (search/trust.py): the family read from traced facts, the rule's verdict on a baseline, the
ranking it leads to (fake tiers), and how the run reports it."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from pallasopt.ir.facts import BodyStats, CallFacts, Dot
from pallasopt.report.summary import MARKDOWN, tier_lines
from pallasopt.search.ranking import TierChoice, choose_tier
from pallasopt.search.tiers import TierResult
from pallasopt.search.trust import TRUST, TrustRule, decide, family_of

NO_HW = {"hardware": "no TPU or GPU visible to JAX on this machine", "compiler": None}
DOT = Dot(1, 128, 128, 128, "bfloat16", "bfloat16", "float32")


def call(body: BodyStats, **kw: object) -> CallFacts:
    base = CallFacts(
        index=0,
        name="k",
        grid=(4, 4),
        operands=(),
        scratch=(),
        num_scalar_prefetch=0,
        dimension_semantics=None,
        vmem_limit_bytes=None,
        compiler_params={},
        body=body,
        span=None,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def tiers(model_ms: float, compiler_ms: float) -> dict[str, TierResult]:
    return {
        "model": TierResult("model", True, model_ms * 1e-3, "compute-bound"),
        "compiler": TierResult("compiler", True, compiler_ms * 1e-3, "static schedule"),
    }


def test_family_is_read_from_the_traced_facts() -> None:
    attention = BodyStats(dots=(DOT, DOT), transcendental_elems=1024, primitives=("dot_general", "exp", "reduce_max"))
    assert family_of([call(attention)]) == "attention"
    # Two matmuls without a softmax between them (e.g. a gated MLP) are not attention.
    assert family_of([call(replace(attention, transcendental_elems=0))]) == "dense_matmul"
    assert family_of([call(BodyStats(dots=(DOT,)))]) == "dense_matmul"
    assert family_of([call(BodyStats(dots=(DOT,)), num_scalar_prefetch=2)]) == "data_dependent_matmul"
    assert family_of([call(BodyStats(dots=(DOT,)), dynamic_axes=(0,))]) == "data_dependent_matmul"
    assert family_of([call(BodyStats(dots=(DOT,), inner_steps=12.0))]) == "data_dependent_matmul"
    assert family_of([call(BodyStats(vpu_elems=10, primitives=("exp", "reduce_max")))]) == "other"
    assert family_of([]) == "other"
    # The call with the most MXU work decides: a small elementwise prologue does not hide a matmul.
    assert family_of([call(BodyStats(vpu_elems=10)), call(BodyStats(dots=(DOT,)), index=1)]) == "dense_matmul"


RULE = {"dense_matmul": TrustRule("dense_matmul", "model", 1.3, ("v5e",), "ev.json", "because")}


def test_a_rule_applies_only_beyond_its_threshold_and_on_its_chips() -> None:
    v = decide("dense_matmul", "v5e", 1.0, 1.5, RULE)
    assert v is not None and v["applied"] and v["rule"] == "model" and v["ratio"] == pytest.approx(1.5)
    v = decide("dense_matmul", "v5e", 1.5, 1.0, RULE)  # the compiler much faster is a disagreement too
    assert v is not None and v["applied"]
    v = decide("dense_matmul", "v5e", 1.0, 1.2, RULE)
    assert v is not None and not v["applied"]
    assert decide("dense_matmul", "v6e", 1.0, 2.0, RULE) is None  # no evidence on v6e
    assert decide("other", "v5e", 1.0, 2.0, RULE) is None
    v = decide("dense_matmul", "v5e", None, 2.0, RULE)  # no model time: nothing to compare
    assert v is not None and not v["applied"] and v["ratio"] is None


def test_every_rule_names_its_evidence_file() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for rule in TRUST.values():
        assert rule.trust in ("model", "compiler") and rule.threshold > 1.0
        assert (root / rule.evidence).is_file(), rule.evidence


@pytest.mark.parametrize(
    ("family", "target", "model_ms", "compiler_ms", "tier"),
    [
        ("dense_matmul", "v5e", 1.0, 1.6, "model"),  # the data backs the model and the tiers disagree: model ranks
        ("dense_matmul", "v5e", 1.0, 1.1, "compiler"),  # within the threshold: the compiler keeps ranking
        ("dense_matmul", "v6e", 1.0, 1.6, "compiler"),  # no rule for v6e
        ("other", "v5e", 1.0, 3.0, "compiler"),  # no rule for the family
        (None, "v5e", 1.0, 3.0, "compiler"),  # no family given: the old behaviour
    ],
)
def test_choose_tier_applies_the_family_rule(family, target, model_ms, compiler_ms, tier, monkeypatch) -> None:
    import pallasopt.search.trust as trust

    monkeypatch.setattr(trust, "TRUST", RULE)
    c = choose_tier(tiers(model_ms, compiler_ms), NO_HW, target, screened=False, family=family)
    assert c.tier == tier
    if tier == "model":
        why = dict(c.not_used)["compiler"]
        assert "1.60x" in why and "dense_matmul" in why and "ev.json" in why
    assert (c.trust is not None) == (family == "dense_matmul" and target == "v5e")


def test_the_verdict_travels_with_the_run_and_is_reported(monkeypatch) -> None:
    import pallasopt.search.trust as trust

    monkeypatch.setattr(trust, "TRUST", RULE)
    c = choose_tier(tiers(1.0, 2.0), NO_HW, "v5e", screened=False, family="dense_matmul")
    d = c.to_dict()
    assert d["tier"] == "model" and d["trust"]["applied"] and d["trust"]["evidence"] == "ev.json"
    again = TierChoice.from_dict(d)
    assert again == c
    lines = tier_lines(SimpleNamespace(ranking=again), MARKDOWN)
    assert any("compiler tier not used: disagrees with the model by 2.00x" in x for x in lines)
    assert any("tier trust (dense_matmul): ranked by the model" in x for x in lines)
    kept = choose_tier(tiers(1.0, 1.1), NO_HW, "v5e", screened=False, family="dense_matmul")
    assert any("not applied" in x for x in tier_lines(SimpleNamespace(ranking=kept), MARKDOWN))


def test_a_search_with_fake_tiers_ranks_by_the_trusted_model_and_still_screens_with_the_compiler(monkeypatch) -> None:
    from test_search import MATMUL, FakeTiers, run

    import pallasopt.search.trust as trust
    from pallasopt.ir.kernel_ir import KernelIR

    class Disagreeing(FakeTiers):  # the fake compiler: 2x the model, and it rejects one block size (a VMEM verdict)
        def compiler(self, ir: KernelIR) -> TierResult | None:
            r = super().compiler(ir)
            assert r is not None
            return replace(r, time_s=r.time_s / 1.25 * 2.0) if r.ok and r.time_s else r

    monkeypatch.setattr(trust, "TRUST", RULE)
    ir = KernelIR.from_file(MATMUL)
    first = run(ir, Disagreeing(), depth=1)
    assert first.score_tier == "model"
    assert first.ranking.trust is not None and first.ranking.trust["applied"]
    assert first.best is not first.baseline
    winner = first.best.ir.calls[0].operands[0].block_shape[0]
    assert winner != ir.calls[0].operands[0].block_shape[0]
    fake = Disagreeing(compile_fail_bm=frozenset({winner}))
    out = run(ir, fake, depth=1)
    assert out.score_tier == "model" and fake.calls["compiler"] > 1  # the model ranks, the compiler still screens
    assert out.best.ir.calls[0].operands[0].block_shape[0] != winner


def test_family_of_traced_example_kernels() -> None:
    from pathlib import Path

    from pallasopt.ir.kernel_ir import KernelIR

    root = Path(__file__).resolve().parent.parent
    expected = {
        "examples/attention.py": "attention",
        "examples/matmul.py": "dense_matmul",
        "examples/softmax.py": "other",
        "bench/fidelity_kernels/tutorial_sparse_mask_matmul.py": "data_dependent_matmul",
    }
    got = {f: family_of(KernelIR.from_file(root / f).calls) for f in expected}
    assert got == expected


def test_a_p_norm_tier_is_judged_by_its_max_join_the_rules_were_measured_on(monkeypatch) -> None:
    """fused_04's baseline: the compiler's max(static, floor) 1.25x the model (within the 1.30x rule), its v5e
    p-norm 1.33x: the p-norm's charge for the smaller part must not move a kernel to the model."""
    import pallasopt.search.trust as trust

    monkeypatch.setattr(trust, "TRUST", RULE)
    both = tiers(1.0, 1.33)
    joined = TierResult("compiler", True, 1.33e-3, "static schedule", {"max_join_s": 1.25e-3})
    assert choose_tier(both, NO_HW, "v5e", screened=False, family="dense_matmul").tier == "model"
    c = choose_tier({**both, "compiler": joined}, NO_HW, "v5e", screened=False, family="dense_matmul")
    assert c.tier == "compiler" and c.trust is not None and c.trust["ratio"] == pytest.approx(1.25)
