"""The short form of the chaos run (scripts/chaos.py runs the long one)."""

from tests.system.stress.harness import run


def test_kill_producers_and_consumers_at_random(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    report = run(str(tmp_path / "q"), str(logs), messages=2000, kill_every=0.4, deadline=150)
    print(report)
    assert report.kills["p"] + report.kills["c"] >= 3  # it did kill
    assert report.published == 2000
    assert report.ok(), str(report)
