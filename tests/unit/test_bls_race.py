"""build_scripts/bls_race.py: the repository it writes and how it reports a round (no server)."""

from __future__ import annotations

from build_scripts import bls_race


def test_the_repository_has_the_stream_and_race_models_both_decoupled(tmp_path):
    repo = bls_race.write_repository(tmp_path / "models")
    for name in ("stream", "race"):
        config = (repo / name / "config.pbtxt").read_text()
        assert f'name: "{name}"' in config and "decoupled: true" in config
        assert (repo / name / "1" / "model.py").read_text().startswith("import")
    race = (repo / "race" / "1" / "model.py").read_text()
    assert "exec(decoupled=True)" in race and "dump_traceback_later" in race


def test_a_given_stub_is_copied_beside_each_model(tmp_path):
    stub = tmp_path / "stub"
    stub.write_bytes(b"\x7fELF")
    repo = bls_race.write_repository(tmp_path / "models", stub)
    assert all((repo / n / "triton_python_backend_stub").read_bytes() == b"\x7fELF" for n in ("stream", "race"))


def test_round_lines_name_a_hang_and_the_rate():
    assert bls_race.RoundResult(50.0, error="HUNG: no answer within 50 s").line() == \
        "HUNG: no answer within 50 s after 50.0 s"
    line = bls_race.RoundResult(20.0, calls=1000, responses=8000, bad=0).line()
    assert line.startswith("1000 BLS streams (50/s), 8000 responses, 0 wrong")
