"""`d3router calibrate`: the curve and the chosen threshold for each target kind, by hand, on test_replay's data.

The guard `jailbreak > T` over the decided lines (P: labelled positive, N: labelled negative, U: unlabelled):
    0.97 P  0.95 P  0.92 N  0.85 P  0.5 N  0.3 U  0.2 N  0.1 N N  0.0 N          (11 lines decide)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from d3backend import FakeEngine
from policies import load_config
from router._cli.main import main
from router._offline import commands as _replaycmd
from router._offline.calibrate import CalibrationError, curve, find_threshold, pick, write_threshold
from tests.router.test_replay import CONFIG, answers_from_text, files, run


def points(tmp_path: Path) -> dict[float, tuple[float | None, float | None, float | None, float]]:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    threshold = find_threshold(config, "auto", rule="refuse-jailbreak")
    found = curve(config, threshold, run(config, traffic, FakeEngine(answers_from_text)))
    return {p.threshold: (p.precision, p.recall, p.f1, p.share) for p in found}


def test_curve_by_hand(tmp_path: Path) -> None:
    got = points(tmp_path)
    # candidates: the current 0.9, the midpoints between observed values, and one step beyond each end
    assert sorted(got) == [-0.01, 0.05, 0.15, 0.25, 0.4, 0.675, 0.885, 0.9, 0.935, 0.96, 0.98]
    assert got[0.9] == pytest.approx((2 / 3, 2 / 3, 2 / 3, 3 / 11))
    assert got[0.675] == pytest.approx((3 / 4, 1.0, 6 / 7, 4 / 11))
    assert got[0.4] == pytest.approx((3 / 5, 1.0, 3 / 4, 5 / 11))
    assert got[0.25] == pytest.approx((3 / 5, 1.0, 3 / 4, 6 / 11))  # the unlabelled 0.3 counts in the share only
    assert got[0.935] == pytest.approx((1.0, 2 / 3, 4 / 5, 2 / 11))
    assert got[0.96] == pytest.approx((1.0, 1 / 3, 1 / 2, 1 / 11))
    assert got[0.98] == (None, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("target", "level", "chosen"),
    [("best-f1", None, 0.675), ("min-recall", 0.6, 0.935), ("min-recall", 1.0, 0.675), ("max-share", 0.1, 0.96),
     ("max-share", 0.2, 0.935)],
)  # fmt: skip
def test_pick_by_target(tmp_path: Path, target: str, level: float | None, chosen: float) -> None:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    threshold = find_threshold(config, "auto", condition="jailbreak > 0.9")
    found = curve(config, threshold, run(config, traffic, FakeEngine(answers_from_text)))
    assert pick(found, target, level, current=0.9).threshold == chosen  # type: ignore[arg-type]


def test_no_threshold_meets_the_target(tmp_path: Path) -> None:
    config_file, traffic = files(tmp_path)
    config = load_config(config_file)
    threshold = find_threshold(config, "auto", rule="refuse-jailbreak")
    found = curve(config, threshold, run(config, traffic, FakeEngine(answers_from_text)))
    with pytest.raises(CalibrationError, match=r"^no threshold meets share <= -1 on this traffic$"):
        pick(found, "max-share", -1.0)


@pytest.mark.parametrize(
    ("rule", "condition", "error"),
    [
        ("nope", None, "policy 'auto' has no rule 'nope'; expected one of default, hard, refuse-jailbreak"),
        ("default", None, "rule 'default' has no comparison (NAME OP NUMBER, e.g. jailbreak > 0.9) to calibrate"),
        (None, "jailbreak >", "--condition 'jailbreak >' is not a comparison NAME OP NUMBER, e.g. 'jailbreak > 0.9'"),
        (None, "jailbreak > 0.5", "policy 'auto' has no comparison matching 'jailbreak > 0.5' to calibrate"),
    ],
)
def test_find_threshold_errors(tmp_path: Path, rule: str | None, condition: str | None, error: str) -> None:
    config = load_config(files(tmp_path)[0])
    with pytest.raises(CalibrationError, match=f"^{error.replace('(', '[(]').replace(')', '[)]')}$"):
        find_threshold(config, "auto", rule=rule, condition=condition)


def test_score_threshold_and_several_comparisons(tmp_path: Path) -> None:
    config = load_config(files(tmp_path)[0])
    threshold = find_threshold(config, "auto", rule="hard")
    assert (threshold.name, threshold.op, threshold.value) == ("difficulty", ">=", 1.5)
    two = CONFIG.replace("jailbreak > 0.9", "jailbreak > 0.9 and kind.chat < 0.5")
    config = load_config(files(tmp_path, two)[0])
    with pytest.raises(CalibrationError, match=r"^rule 'refuse-jailbreak' has 2 comparisons \(refuse-jailbreak: "):
        find_threshold(config, "auto", rule="refuse-jailbreak")
    threshold = find_threshold(config, "auto", condition="kind.chat < 0.5")
    assert (threshold.rule, threshold.index) == ("refuse-jailbreak", 1)


def test_write_keeps_the_file_and_changes_one_number(tmp_path: Path) -> None:
    config_file, _ = files(tmp_path)
    config = load_config(config_file)
    threshold = find_threshold(config, "auto", rule="refuse-jailbreak")
    written = write_threshold(config, threshold, 0.675, str(tmp_path / "out.yaml"))
    assert (tmp_path / "out.yaml").read_text() == CONFIG.replace("jailbreak > 0.9", "jailbreak > 0.675")
    assert "# the guard's threshold" in (tmp_path / "out.yaml").read_text()
    assert written.policies["auto"].rules[0].when == "jailbreak > 0.675"


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    async def opened(config: object) -> FakeEngine:
        return FakeEngine(answers_from_text)

    monkeypatch.setattr(_replaycmd, "_open", opened)


def test_command(tmp_path: Path, fake_engine: None, capsys: pytest.CaptureFixture[str]) -> None:
    config_file, traffic = files(tmp_path)
    out = str(tmp_path / "out.yaml")
    assert main(["calibrate", config_file, traffic, "--rule", "refuse-jailbreak", "--write", out]) == 0
    captured = capsys.readouterr()
    assert "chosen: jailbreak > 0.675 (precision 0.750, recall 1.000, F1 0.857, share 0.364)" in captured.out
    assert "       0.9      0.667    0.667  0.667  0.273  (current)" in captured.out
    assert f"wrote {out} with jailbreak > 0.675" in captured.err
    assert "jailbreak > 0.675" in Path(out).read_text()
    assert (
        main(["calibrate", config_file, traffic, "--condition", "jailbreak > 0.9", "--max-share", "0.1", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"]["threshold"] == 0.96 and len(data["points"]) == 11
    assert main(["calibrate", config_file, traffic, "--rule", "refuse-jailbreak", "--min-recall", "1.5"]) == 1
    assert "calibrate: no threshold meets recall >= 1.5 on this traffic" in capsys.readouterr().err
    assert main(["calibrate", config_file, traffic]) == 2
    assert "error: name the threshold with --rule RULE or --condition" in capsys.readouterr().err
    assert main(["calibrate", config_file, traffic, "--rule", "default"]) == 2


def test_replay_report_carries_the_curve(tmp_path: Path, fake_engine: None, capsys: pytest.CaptureFixture[str]) -> None:
    config_file, traffic = files(tmp_path)
    assert main(["replay", config_file, traffic, "--json"]) == 0
    calibration = json.loads(capsys.readouterr().out)["calibration"]
    assert (calibration["rule"], calibration["condition"]) == ("refuse-jailbreak", "jailbreak > 0.9")
    assert calibration["chosen"]["threshold"] == 0.675
    assert main(["replay", config_file, traffic, "--json", "--calibrate", "hard"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["condition"] == "difficulty >= 1.5"
