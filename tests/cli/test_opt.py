"""paddlejax opt on the text form: a .pdir file or stdin in, text or a saved program out, with
the parameters from a safetensors file; parse is the inverse of the printed output."""
import io
import sys

import numpy as np
import pytest

import paddlejax as pj
from paddlejax.cli.main import main


@pytest.fixture
def text(saved, tmp_path):
    """``saved``'s program as text in m.pdir, its parameters in m.safetensors beside it."""
    prog, path = saved
    (tmp_path / "m.pdir").write_text(str(prog) + "\n")
    return prog, tmp_path / "m.pdir"


def one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err.rstrip("\n")


def test_text_in_text_out_is_what_the_pass_prints_and_parses_back(text, capsys):
    prog, path = text
    assert main(["opt", str(path), "--passes", "eliminate_identity,dce", "--emit", "text"]) == 0
    out, err = capsys.readouterr()
    expected = pj.passes.run(pj.parse(path.read_text(), params=prog.params), "eliminate_identity,dce")
    assert out == str(expected) + "\n" and "identities=1" in err  # the report goes to stderr
    assert "lax.mul" in str(prog) and "lax.mul" not in out
    assert str(pj.parse(out)) == out.rstrip("\n")


def test_text_with_its_parameters_saves_a_program_computing_the_same(text, tmp_path, capsys):
    prog, path = text
    assert main(["opt", str(path), "--passes", "eliminate_identity,dce", "-o", str(tmp_path / "opt")]) == 0
    assert "saved" in capsys.readouterr().out
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(pj.load(tmp_path / "opt")(x), prog(x))


def test_stdin_and_a_text_file_with_its_tensors_written_beside(text, tmp_path, capsys, monkeypatch):
    prog, path = text
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    out = tmp_path / "small.pdir"
    assert main(["opt", "-", "--params", str(tmp_path / "m.safetensors"), "--passes", "dce", "--emit", "text",
                 "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    again = pj.parse(out.read_text(), params=tmp_path / "small.safetensors")
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(again(x), prog(x))
    assert str(again) == str(prog)


def test_without_parameters_text_out_uses_placeholders_and_saving_is_refused(text, tmp_path, capsys):
    prog, path = text
    bare = tmp_path / "bare.pdir"
    bare.write_text(path.read_text())
    assert main(["opt", str(bare), "--passes", "dce", "--emit", "text", "-o", str(tmp_path / "b2.pdir")]) == 0
    assert not (tmp_path / "b2.safetensors").exists()  # placeholders are not written as parameters
    capsys.readouterr()
    assert main(["opt", str(bare), "--passes", "dce", "-o", str(tmp_path / "b3")]) == 2
    assert one_line_error(capsys) == (f"paddlejax opt: error: {bare} has no parameter values to save: give --params "
                                      f"FILE.safetensors (or put {tmp_path / 'bare'}.safetensors beside it)")


@pytest.mark.parametrize("argv, message", [
    (["--emit", "text", "-o", "{dir}/m.pdir"],
     "-o {dir}/m.pdir would overwrite the input {dir}/m.pdir; give another path"),
    (["--emit", "text", "-o", "{dir}/out.txt"], "-o {dir}/out.txt must end in .pdir"),
    (["-o", "{dir}/"], "-o {dir}/ names a directory; give the program's path inside it, e.g. {dir}/model"),
])
def test_bad_outputs_are_refused_before_any_work(text, tmp_path, capsys, argv, message):
    _, path = text
    argv = [a.format(dir=tmp_path) for a in argv]
    assert main(["opt", str(path), "--passes", "dce", *argv]) == 2
    assert one_line_error(capsys) == "paddlejax opt: error: " + message.format(dir=tmp_path)


def test_malformed_text_is_one_line_naming_file_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.pdir"
    bad.write_text("program @f(%x: f32[2]) -> (f32[2]) {\n  %0 = relu(%x) f32[2]\n}\n")
    assert main(["opt", str(bad), "--passes", "dce", "--emit", "text"]) == 2
    assert one_line_error(capsys) == (f"paddlejax opt: error: {bad}: line 2, column 17: expected ':' and the "
                                      "result types, found 'f32[2]'")


def test_params_are_for_text_programs_only(saved, tmp_path, capsys):
    _, path = saved
    assert main(["opt", str(path), "--params", str(tmp_path / "m.safetensors"), "--passes", "dce", "-o",
                 str(tmp_path / "o")]) == 2
    assert one_line_error(capsys) == (f"paddlejax opt: error: --params is for a program's text (.pdir or -); {path} "
                                      "is a saved program with its own tensors")


def test_a_saved_program_prints_as_text(saved, capsys):
    prog, path = saved
    assert main(["opt", str(path), "--passes", "dce", "--emit", "text"]) == 0
    assert capsys.readouterr().out == str(prog) + "\n"
