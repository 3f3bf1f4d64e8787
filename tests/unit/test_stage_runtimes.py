"""scripts/stage_runtimes.py: README's runtime table from measurements only (crafted inputs)."""
import json

from repo_files import load

stage_runtimes = load("scripts/stage_runtimes.py")

HEAD = "stage,profile,seconds,device,threads,cpu,finished_utc\n"


def test_latest_whole_runs_estimates_and_unchanged_stages(tmp_path):
    log = tmp_path / "runtimes.csv"
    log.write_text(HEAD + "perm_fig1,default,40.0,cpu,1,X x2,2026-01-01T00:00:00Z\n"
                          "perm_fig1,default,37.5,cpu,1,X x2,2026-01-02T00:00:00Z\n"  # newer wins
                          "perm_fig2,default,900.0,cpu,1,X x2,2026-01-02T00:00:00Z\n"
                          "perm_fig5,default,10.0,cpu,1,X x2,2026-01-02T00:00:00Z\n")
    estimates = tmp_path / "est.json"
    estimates.write_text(json.dumps({"stages": [{"stage": "perm_fig2", "profile": "paper", "device": "cpu",
                                                 "threads": 1, "cpu": "X x2", "seconds": 36000.0, "how": "one round",
                                                 "finished_utc": "2026-01-03T00:00:00Z"}]}))
    params = tmp_path / "params.yaml"
    params.write_text("profiles:\n  paper:\n    perm_fig2: {rounds: 300}\n    perm_fig5: {alpha_file: x.npz}\n")
    table = stage_runtimes.rows(log, estimates, tmp_path / "none.csv", params)
    got = {(r["stage"], r["profile"]): (r["seconds"], r["how"]) for r in table}
    assert got == {("perm_fig1", "default"): ("37.5", "whole run"),
                   ("perm_fig2", "default"): ("900.0", "whole run"),
                   ("perm_fig5", "default"): ("10.0", "whole run"),
                   ("perm_fig2", "paper"): ("36000", "estimate: one round"),
                   # no overlay, or one that only moves files: the default run stands for it
                   ("perm_fig1", "paper"): ("37.5", "same settings as the default profile (no overlay)"),
                   ("perm_fig5", "paper"): ("10.0", "same settings as the default profile (no overlay)")}
    md = stage_runtimes.to_markdown(table)
    assert "| perm_fig1 | 38 s | 38 s (=) |" in md
    assert "| perm_fig2 | 15.0 min | 10.0 h (est.) |" in md
    assert "| **all** | **15.8 min** (3 stages) | **10.0 h** (3 stages) |" in md
    # each column names the machines its rows ran on, counted where they differ
    assert ("Measured on: default profile, cpu: X x2, 1 torch thread(s); paper profile, cpu: X x2, 1 torch "
            "thread(s).") in md
    log.write_text(HEAD + "perm_fig1,default,37.5,cpu,1,X x2,2026-01-02T00:00:00Z\n"
                          "perm_fig1,paper,30.0,cpu,2,Y x4,2026-01-02T00:00:00Z\n"
                          "perm_fig2,paper,36.0,cpu,2,Y x4,2026-01-02T00:00:00Z\n"
                          "perm_fig5,default,10.0,cpu,1,X x2,2026-01-02T00:00:00Z\n")
    md = stage_runtimes.to_markdown(stage_runtimes.rows(log, tmp_path / "none.json", tmp_path / "none.csv", params))
    assert ("Measured on: default profile, cpu: X x2, 1 torch thread(s); paper profile, cpu: Y x4, 2 torch "
            "thread(s) (2 stages), X x2, 1 torch thread(s) (1 stages).") in md


def test_an_incomplete_estimate_is_a_lower_bound(tmp_path):
    estimates = tmp_path / "est.json"
    estimates.write_text(json.dumps({"stages": [{"stage": "perm_fig2", "profile": "paper", "device": "cpu",
                                                 "threads": 1, "cpu": "X x2", "seconds": 7200.0, "how": "one round",
                                                 "complete": False, "finished_utc": "2026-01-03T00:00:00Z"}]}))
    params = tmp_path / "params.yaml"
    params.write_text("profiles:\n  paper:\n    perm_fig2: {rounds: 300}\n")
    table = stage_runtimes.rows(tmp_path / "none.csv", estimates, tmp_path / "none.csv", params)
    assert [r["how"] for r in table] == ["lower-bound estimate: one round"]
    md = stage_runtimes.to_markdown(table)
    assert "| perm_fig2 | > 2.0 h (est., lower bound) |" in md and "| **all** | **> 2.0 h** (1 stages) |" in md
