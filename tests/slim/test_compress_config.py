"""PaddleSlim 1.x compression configs: read strictly, their strategies mapped onto pruning,
sensitivity, the auto-pruner, distillation and quantization, and run on a program."""
import numpy as np
import pytest

import paddlejax as pj
from paddlejax import analysis
from paddlejax.slim.auto_compress import compress_with_config
from paddlejax.slim.compress_config import feature, fidelity, read_config

PRUNER = {"pruner_1": {"class": "StructurePruner", "pruning_axis": {"*": 0}, "criterions": {"*": "l1_norm"}}}


def config(strategies, order=None, epochs=0, **sections):
    return {"version": 1.0, "pruners": PRUNER, **sections, "strategies": strategies,
            "compressor": {"epoch": epochs, "strategies": order or list(strategies)}}


@pytest.mark.parametrize("doc, message", [
    (config({"s": {"class": "AutoPruneStrategy", "pruner": "pruner_1", "controller": "sa"}}),
     "names 'sa', which controllers does not define"),
    (config({"s": {"class": "DistillationStrategy", "distillers": ["l2"]}}), "names 'l2', which distillers"),
    (config({"s": {"class": "UniformPruneStrategy", "pruner": "pruner_1", "target_ratio": 1.5}}),
     r"target_ratio must be a number in \[0.01, 0.99\]"),
    ({"pruners": {"p": {"class": "StructurePruner", "pruning_axis": {"*": 1}}}}, "only axis 0"),
    ({"pruners": {"p": {"class": "StructurePruner", "criterions": {"a": "l1_norm", "b": "bn_scale"}}},
      "strategies": {"s": {"class": "UniformPruneStrategy", "pruner": "p"}}}, "one criterion for all parameters"),
    ({"distillers": {"d": {"class": "L2Distiller", "teacher_feature": "x"}}}, "unknown key 'teacher_feature'"),
    ({"controllers": {"c": {"class": "RLController"}}}, "only 'SAController' is known"),
    ({"compresser": {}}, "unknown key 'compresser' in the config"),
    ({"include": "base.yaml"}, "'include' of other config files is not supported"),
    ("- just\n- a list\n", "the top level must be a mapping"),
])
def test_configs_that_do_not_hold_together_are_refused_by_name(doc, message):
    with pytest.raises(ValueError, match=message):
        read_config(doc)


def test_a_config_file_reads_with_light_nas_and_its_controller():
    doc = {"controllers": {"sa": {"class": "SAController", "reduce_rate": 0.9, "init_temperature": 10.24,
                                  "max_iter_number": 30}},
           "strategies": {"nas": {"class": "LightNASStrategy", "controller": "sa", "target_flops": 1000,
                                  "search_steps": 4}}}
    plan = read_config(doc)
    (strategy,) = plan.strategies
    assert strategy.kind == "light_nas" and strategy.options["reduce_rate"] == 0.9
    assert strategy.options["target_flops"] == 1000 and strategy.options["search_steps"] == 4



def test_feature_maps_name_outputs_or_the_op_reading_a_parameter(untrained_digits):
    prog = untrained_digits
    assert feature(prog, "output") is prog.outputs[0]
    assert feature(prog, "features.3.weight").producer.type == "conv2d"
    assert feature(prog, "features.3.weight").producer.input("weight").producer.attrs["name"] == "features.3.weight"
    with pytest.raises(ValueError, match="neither 'output\\[:K\\]' nor a parameter"):
        feature(prog, "conv2d_3.tmp_0")
    with pytest.raises(ValueError, match="has 1 outputs"):
        feature(prog, "output:1")


def test_fidelity_is_top1_agreement_for_logits_else_one_minus_the_relative_error():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert fidelity([a], [a[::-1]]) == 0.0 and fidelity([a], [a * 3]) == 1.0
    v = np.array([3.0, 4.0])
    assert fidelity([v], [v * 1.1]) == pytest.approx(0.9)


@pytest.fixture(scope="module")
def network_and_images(untrained_digits):
    return untrained_digits, pj.data.Digits("train").arrays()[0][:80]


def flops(prog):
    return analysis.flops(prog, {"b": 1})


def test_sensitive_pruning_reaches_its_flops_target(network_and_images, tmp_path):
    prog, x = network_and_images
    doc = config({"s": {"class": "SensitivePruneStrategy", "pruner": "pruner_1", "target_ratio": 0.3,
                        "delta_rate": 0.3, "sensitivities_file": str(tmp_path / "sens.json"),
                        "metric_name": "acc_top1"}})
    result = compress_with_config(prog, [x], doc, batch_size=16, repeats=2, progress=False)
    assert flops(result.program) <= 0.7 * flops(prog)
    assert (tmp_path / "sens.json").exists()  # resumable, as the pruning module's sensitivity() writes it


@pytest.mark.slow
def test_auto_pruning_with_the_sa_controllers_settings_then_fsp_distillation(network_and_images):
    prog, x = network_and_images
    doc = config({"auto": {"class": "AutoPruneStrategy", "pruner": "pruner_1", "controller": "sa",
                           "target_ratio": 0.4, "max_ratio": 0.6, "min_ratio": 0.1},
                  "distill": {"class": "DistillationStrategy", "distillers": ["fsp", "soft"]}},
                 epochs=1,
                 controllers={"sa": {"class": "SAController", "reduce_rate": 0.85, "init_temperature": 10.0,
                                     "max_iter_number": 2}},
                 distillers={"fsp": {"class": "FSPDistiller", "teacher_pairs": [["features.0.weight", "features.3.weight"]],
                                     "student_pairs": [["features.0.weight", "features.3.weight"]],
                                     "distillation_loss_weight": 0.1},
                             "soft": {"class": "SoftLabelDistiller", "teacher_temperature": 2.0,
                                      "student_temperature": 2.0}})
    with pytest.raises(ValueError, match="do not pair up"):  # FSP pairs a pruned student's maps: channels differ
        compress_with_config(prog, [x], doc, batch_size=16, repeats=2, progress=False)
    doc["distillers"]["fsp"]["student_pairs"] = doc["distillers"]["fsp"]["teacher_pairs"] = [["output", "output"]]
    with pytest.raises(ValueError, match="4-d feature maps"):
        compress_with_config(prog, [x], doc, batch_size=16, repeats=2, progress=False)
    doc["strategies"]["distill"]["distillers"] = ["soft"]
    result = compress_with_config(prog, [x], doc, batch_size=16, repeats=2, progress=False)
    assert flops(result.program) <= 0.6 * flops(prog)
    assert [c.name for c in result.candidates] == ["original", "config"] and result.target_speedup is None


def test_quantization_after_training_epochs_is_qat_else_ptq(network_and_images):
    prog, x = network_and_images
    ptq = compress_with_config(prog, [x], config({"q": {"class": "QuantizationStrategy"}}), batch_size=16, repeats=2,
                               progress=False)
    assert any(op.type == "quantized_conv2d" for op in ptq.program.walk())
    assert ptq.candidates[1].error < 0.1
    doc = config({"q": {"class": "QuantizationStrategy", "start_epoch": 0, "end_epoch": 1}}, epochs=1)
    qat = compress_with_config(prog, [x], doc, batch_size=16, learning_rate=1e-5, repeats=2, progress=False)
    types = {op.type for op in qat.program.walk()}
    assert "quantized_conv2d" in types and "fake_quantize" not in types
    assert qat.candidates[1].error < 0.1


def test_light_nas_is_refused_on_a_program_with_the_way_to_run_it(network_and_images):
    prog, x = network_and_images
    doc = {"strategies": {"nas": {"class": "LightNASStrategy"}}, "compressor": {"strategies": ["nas"]}}
    with pytest.raises(ValueError, match="pj.slim.nas.light_nas"):
        compress_with_config(prog, [x], doc, progress=False)
