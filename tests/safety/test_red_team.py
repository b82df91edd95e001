"""Learning check and end-to-end run of examples/red_team.sh on a smaller budget: the tiny model
learns to refuse the toy harmful requests (all 48 held-out phrasings answered as trained), both
attacks raise the target's log-probability on every attacked request, and the estimators agree
with the exact enumeration of the 31^2 hex suffixes (ITGIS and brute force within 10%: a check that
the script's steps hold together, not of the estimators, since f lies within 0.85-1.07 times its mean
over these inputs and a biased estimator would pass too; tests/safety/test_estimate.py checks them).

Figures of the full script (README, docs/safety.md) held with seed 42 under the default kernels,
MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2 and MKL_CBWR=COMPATIBLE (2026-11-27)."""
import glob
import json
import os
import re
import subprocess

import pytest

from tests.conftest import forkserver_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_red_team_example_trains_attacks_and_estimates(tmp_path):
    out = tmp_path / "red_team"
    env, server = forkserver_env({**os.environ, "OUT": str(out), "MAX_TARGETS": "2", "SAMPLES": "2", "GCG_STEPS": "6",
                                  "BEAST_LENGTH": "6", "SEQUENCE_LENGTH": "2"})
    try:
        proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "red_team.sh")], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"^held-out answers as trained: 48/48$", proc.stdout, re.M), proc.stdout
    for attack in ("beast", "gcg"):
        rows = [json.loads(x) for x in open(glob.glob(str(out / f"attack_{attack}" / "*" / "results.jsonl"))[0])]
        assert len(rows) == 2
        for row in rows:  # the target is more likely after the suffix than with the request alone
            assert row["logprob_after"]["mean"] > row["logprob_before"]["mean"], (attack, row)
            assert len(row["responses"]) == 2
        assert re.search(rf"^{attack}: ASR [0-9.]+; ", proc.stdout, re.M)
    estimates = {m: json.load(open(out / f"estimate_{m}.json")) for m in ("exact", "itgis", "bruteforce")}
    assert estimates["exact"]["samples"] == 31 ** 2
    for method in ("itgis", "bruteforce"):
        assert estimates[method]["estimate"] == pytest.approx(estimates["exact"]["estimate"], rel=0.1), method
