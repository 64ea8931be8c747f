"""paddlejax bench: one table of latency and throughput, with and without passes, frozen or not."""

from paddlejax.cli.main import main


def test_bench_prints_every_variant_side_by_side(saved, capsys):
    assert main(["bench", str(saved[1]), "--batch", "4", "--repeats", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("f: batch 4, 2 repeats, ")
    assert lines[1].split() == ["variant", "build", "s", "median", "ms", "samples/s", "speedup"]
    assert [line.split(",")[0] for line in lines[2:]] == ["as saved"] * 2 + ["inference passes"] * 2
    assert [line.split()[-6] for line in lines[2:]] == ["argument", "frozen"] * 2
    assert lines[2].endswith(" 1.00x")


def test_bench_without_passes_and_bad_arguments(saved, capsys):
    assert main(["bench", str(saved[1]), "--batch", "2", "--repeats", "1", "--no-passes"]) == 0
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()[2:]] == ["as saved"] * 2
    assert main(["bench", str(saved[1]), "--batch", "0"]) == 2
    assert "paddlejax bench: error: --batch and --repeats must be positive, got 0 and 20" in capsys.readouterr().err
