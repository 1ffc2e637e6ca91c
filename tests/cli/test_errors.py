from typer.testing import CliRunner

from treerank.cli.main import app


def test_error_messages_keep_bracketed_text(tmp_path) -> None:
    """rich markup must not eat `[...]` in messages (here: the user's own spec, echoed)."""
    from tests.search.tiny_store import write_tiny_store

    write_tiny_store(tmp_path / "test")
    args = ["evaluate", "--store", str(tmp_path / "test"), "--system", "cosine[bold]"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "cosine[bold]" in res.output


def test_unknown_model_is_an_error_with_prefix(tmp_path) -> None:
    res = CliRunner().invoke(
        app, ["train", "--model", "xgb", "--store", str(tmp_path), "--out", "o"]
    )
    assert res.exit_code == 2
    assert "error: unknown model family 'xgb'; known: linear" in res.output
    res = CliRunner().invoke(
        app, ["train", "--model", "lienar", "--store", str(tmp_path), "--out", "o"]
    )
    assert res.exit_code == 2
    assert "error: unknown model family 'lienar'; did you mean 'linear'? known:" in res.output


def test_k_below_one_has_one_wording_in_evaluate_and_search(tmp_path) -> None:
    from tests.search.tiny_store import write_tiny_store

    write_tiny_store(tmp_path / "test")
    want = "error: the run depth k (--k; evaluate.k in an experiment) must be at least 1, got 0"
    store = str(tmp_path / "test")
    for args in (
        ["evaluate", "--store", store, "--k", "0"],
        ["search", "-s", store, "-q", "x", "--k", "0"],
    ):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        assert want in " ".join(res.output.split()), res.output


def test_a_bad_device_is_refused_before_any_work_in_train_and_evaluate(tmp_path) -> None:
    """``--device`` is checked first (exit 2, the device named, nothing written)."""
    import torch

    from tests.search.tiny_store import write_tiny_store

    write_tiny_store(tmp_path / "test")
    store = str(tmp_path / "test")
    bad = ["gpu"] + ([] if torch.cuda.is_available() else ["cuda"])
    for dev in bad:
        for args in (
            ["evaluate", "--store", store, "--device", dev, "--out", str(tmp_path / "e")],
            ["train", "--model", "linear", "--store", store, "--device", dev, "--out", "o"],
            ["diagnose", str(tmp_path / "ck"), "--store", store, "--device", dev, "--out", "d"],
        ):
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 2, res.output
            assert f"error: --device {dev}: device (auto | cpu | cuda[:n]):" in res.output
            assert "Traceback" not in res.output
    assert not (tmp_path / "e").exists()
    res = CliRunner().invoke(
        app,
        ["evaluate", "--store", store, "--device", "cpu", "--system", "cosine", "--no-progress"],
    )
    assert res.exit_code == 0, res.output
