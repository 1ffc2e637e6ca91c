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
