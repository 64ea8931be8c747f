"""PassManager: pipelines by name with options, verification, printing, statistics."""
import dataclasses
import io

import jax.numpy as jnp
import pytest

import paddlejax as pj
from paddlejax.ir import TensorType
from paddlejax.passes import Pass, PassError, PassManager, PassResult, parse_pipeline, register_pass


def test_parse_pipeline_with_options():
    passes = parse_pipeline("dce, fold_constants{max_elements=8}, cse")
    assert [str(p) for p in passes] == ["dce", "fold_constants{max_elements=8}", "cse"]
    assert passes[1].max_elements == 8


@pytest.mark.parametrize("text, message", [
    ("dcee", "unknown pass 'dcee'; did you mean dce"),
    ("fold_constants{size=3}", "has no option 'size'; options: \\['max_elements'\\]"),
    ("fold_constants{max_elements=many}", "option 'max_elements' expects int, got 'many'"),
    ("fold_constants{max_elements=8", "unbalanced braces"),
])
def test_bad_pipelines_are_explained(text, message):
    with pytest.raises((KeyError, ValueError), match=message):
        parse_pipeline(text)


def test_unknown_pass_message_prints_without_quotes():
    with pytest.raises(KeyError) as error:
        parse_pipeline("dce,dcee{x=1}")
    assert str(error.value) == "unknown pass 'dcee'; did you mean dce?"


def test_run_reports_per_pass_statistics_and_keeps_the_input():
    prog = pj.trace(lambda x: (x * 1.0) + (x * 1.0), jnp.ones(3))
    before = str(prog)
    pm = PassManager("eliminate_identity,dce")
    out = pm.run(prog)
    assert str(prog) == before
    assert [(r.name, r.changed, r.stats) for r in pm.records] == [
        ("eliminate_identity", True, {"identities": 2}), ("dce", True, {"erased": 2})]
    report = pm.report().splitlines()
    assert report[0].split() == ["pass", "ops", "changes", "ms"]
    assert report[1].split()[:5] == ["eliminate_identity", "6", "->", "4", "identities=2"]
    assert [op.type for op in out.walk()] == ["lax.add", "return"]


def test_print_ir_after_selected_passes():
    stream = io.StringIO()
    prog = pj.trace(lambda x: x * 1.0, jnp.ones(3))
    PassManager("eliminate_identity,dce", print_ir_after={"dce"}, stream=stream).run(prog)
    text = stream.getvalue()
    assert "// ----- IR after dce -----" in text and "after eliminate_identity" not in text
    assert "program @<lambda>(%x: f32[3]) -> (f32[3]) {\n  return %x\n}" in text


@register_pass
@dataclasses.dataclass(frozen=True)
class BreakTypes(Pass):
    """A deliberately wrong pass: it changes a result type without changing the op."""

    name = "test_break_types"

    def apply(self, program, ctx):
        program.body.ops[0].results[0].type = TensorType((7,), "float32")
        return PassResult(True, {})


def test_verification_after_each_pass_names_the_culprit():
    prog = pj.trace(lambda x: pj.ops.relu(x), jnp.ones(3))
    with pytest.raises(PassError, match="pass 'test_break_types' left an invalid program: op #0 'relu'"):
        PassManager("dce,test_break_types").run(prog)


def test_pass_objects_and_the_run_shortcut():
    prog = pj.trace(lambda x: x + 0.0, jnp.ones(3))
    out = pj.passes.run(prog, [pj.passes.EliminateIdentity(), "dce"])
    assert [op.type for op in out.walk()] == ["return"]


def test_named_pipelines_expand_in_place():
    from paddlejax.passes.manager import register_pipeline, registered_pipelines

    register_pipeline("test_tidy", "eliminate_identity,dce")
    assert registered_pipelines()["test_tidy"] == "eliminate_identity,dce"
    assert [str(p) for p in parse_pipeline("cse,test_tidy")] == ["cse", "eliminate_identity", "dce"]
    with pytest.raises(ValueError, match="pipeline 'test_tidy' takes no options"):
        parse_pipeline("test_tidy{x=1}")
    with pytest.raises(ValueError, match="'dce' is already the name of a pass"):
        register_pipeline("dce", "cse")


def test_the_inference_pipeline_lists_the_registered_passes_in_order():
    from paddlejax.passes.manager import INFERENCE_PIPELINE, inference_pipeline

    names = inference_pipeline().split(",")
    assert names == [n for n in INFERENCE_PIPELINE if n in pj.passes.registered_passes()]
    assert {"eliminate_identity", "fold_constants", "cse", "dce"} <= set(names)
    assert [str(p) for p in parse_pipeline("inference")] == names
