"""The parity certificate: one block holding everything a kept change's parity rests on."""

from __future__ import annotations

from harness.certificate import parity_certificate
from harness.parity import Drift, ParityReport, PromptVerdict
from harness.workload import Scores, WorkloadReport

HELD = tuple(PromptVerdict(f"held-{i}", True, None, None, None, None) for i in range(80))


def _report(bench_drift: float, candidate_only: int = 0) -> ParityReport:
    scores = Scores(reference_wrong=4, candidate_wrong=4 + candidate_only, candidate_only=candidate_only,
                    reference_only=0, p_value=0.5 ** candidate_only, alpha=0.01)
    workload = WorkloadReport(requests=2304, identical=2304, scores=scores, positions=38400, tolerance=1e-4,
                              drift=Drift(bench_drift, "in512/out64#r3 request 29", 13, 199))
    return ParityReport(verdicts=HELD, reference_digest="d", candidate_digest="d", tolerance=1e-4,
                        drift=Drift(1.72e-5, "held-in1024-3", 29, 181), workload=workload)


def lines_mention(cert: dict, text: str) -> bool:
    return any(text in line for line in cert["lines"])


def test_a_clean_ab_certifies_held_ids_both_drifts_the_answer_test_and_the_basis() -> None:
    cert = parity_certificate(_report(1.62e-5), tolerance_basis="A/A on the embedded spec",
                              roofline={"in512/out64": {"mfu": 0.012, "bandwidth": 0.3}})
    assert cert["ok"] and cert["held"] == {**cert["held"], "prompts": 80, "identical": 80, "mismatches": 0}
    assert cert["held"]["drift"]["within"] and cert["benchmark"]["drift"]["within"]
    assert cert["benchmark"]["positions"] == 38400 and cert["answers"]["worse"] is False
    assert cert["line"] == ("ok: held 80/80 identical, drift 1.7e-05 within the tolerance 0.0001; benchmark "
                            "2304/2304 identical, drift 1.6e-05 within the tolerance 0.0001 over 38400 positions; "
                            "wrong answers 4 vs 4 (p 1)")
    assert lines_mention(cert, "largest at held-in1024-3 token 29")
    lines = cert["lines"]
    assert lines[-2] == "tolerance basis: A/A on the embedded spec"
    assert lines[-1] == "roofline in512/out64: MFU 1.2%, bandwidth 30.0%"


def test_a_drift_on_the_benchmarks_requests_alone_makes_the_certificate_broken() -> None:
    cert = parity_certificate(_report(0.31), tolerance_basis="b")
    assert not cert["ok"] and cert["held"]["drift"]["within"] and not cert["benchmark"]["drift"]["within"]
    assert cert["line"].startswith("BROKEN: ") and "drift 0.31 ABOVE the tolerance 0.0001 over 38400" in cert["line"]
    worse = parity_certificate(_report(1e-5, candidate_only=8), tolerance_basis="b")
    assert not worse["ok"] and worse["answers"]["worse"] and "WORSE" in worse["lines"][2]
