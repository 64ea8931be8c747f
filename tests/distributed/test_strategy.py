"""Strategy fields, their validation, and the meshes a strategy asks for."""
import jax
import pytest

from paddlejax.distributed import GradientMerge, Pipeline, Sharding, Strategy, dp_axes, dp_size, make_mesh


def test_defaults_are_plain_data_parallelism_over_every_device():
    s = Strategy()
    assert (s.amp, s.sharding.stage, s.gradient_merge.k_steps, s.fuse_grad_size_in_MB) == (None, 0, 1, 32.0)
    mesh = make_mesh(s)
    assert dict(mesh.shape) == {"dp": 8} and dp_axes(mesh) == ("dp",) and dp_size(mesh) == 8


def test_nested_options_accept_dicts_and_stay_frozen():
    s = Strategy(sharding={"stage": 3}, pipeline={"stages": 2, "micro_batches": 4, "schedule": "1f1b"})
    assert s.sharding == Sharding(stage=3) and s.pipeline == Pipeline(2, 4, "1f1b") and s.pp_size == 2
    with pytest.raises(AttributeError):
        s.sharding.stage = 1
    assert s.replace(amp="bf16").amp == "bf16" and s.amp is None


@pytest.mark.parametrize("kwargs, message", [
    ({"amp": "fp8"}, "Strategy.amp"),
    ({"fuse_grad_size_in_MB": 0}, "Strategy.fuse_grad_size_in_MB"),
    ({"fuse_all_reduce": 1}, "Strategy.fuse_all_reduce"),
    ({"dp_degree": 0}, "Strategy.dp_degree"),
    ({"hierarchical_allreduce_inter_nranks": 0}, "Strategy.hierarchical_allreduce_inter_nranks"),
    ({"hierarchical_allreduce_inter_nranks": 2},
     r"hierarchical_allreduce_inter_nranks: 2 has no effect without hierarchical_allreduce=True"),
    ({"sharding": {"stage": 4}}, "Sharding.stage"),
    ({"sharding": {"level": 1}}, "Strategy.sharding: unknown option"),
    ({"gradient_merge": GradientMerge(k_steps=2), "pipeline": {"schedule": "zb"}}, "Pipeline.schedule"),
    ({"gradient_merge": {"k_steps": 0}}, "GradientMerge.k_steps"),
    ({"pp_degree": 2, "pipeline": {"stages": 4}}, "Strategy.pp_degree"),
])
def test_bad_fields_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Strategy(**kwargs)


def test_the_trainer_takes_a_strategy_as_a_dict_of_its_fields():
    import optax
    from flax import nnx

    import paddlejax as pj

    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    trainer = pj.Trainer(model, optax.sgd(0.1), strategy={"sharding": {"stage": 1}})
    assert trainer.strategy == Strategy(sharding=Sharding(stage=1)) and trainer.dp.stage == 1
    with pytest.raises(ValueError, match="Trainer.strategy: unknown option.s. stage; known: amp"):
        pj.Trainer(model, optax.sgd(0.1), strategy={"stage": 1})
    with pytest.raises(ValueError, match="Trainer.strategy: expected a Strategy or a dict, got str"):
        pj.Trainer(model, optax.sgd(0.1), strategy="dp")


def test_tensor_parallel_meshes_put_mp_innermost_so_its_groups_are_neighbours():
    mesh = make_mesh(Strategy(tensor_parallel_degree=2))
    assert dict(mesh.shape) == {"dp": 4, "mp": 2} and dp_axes(mesh) == ("dp",) and dp_size(mesh) == 4
    assert [d.id for d in mesh.devices[0]] == [d.id for d in jax.devices()[:2]]
    mesh = make_mesh(Strategy(tensor_parallel_degree=2, expert_parallel_degree=2))
    assert dict(mesh.shape) == {"dp": 2, "ep": 2, "mp": 2} and dp_axes(mesh) == ("dp", "ep")


@pytest.mark.parametrize("kwargs, message", [
    ({"tensor_parallel_degree": 0}, "tensor_parallel_degree: expected an int >= 1, got 0"),
    ({"tensor_parallel_degree": 2, "sharding": {"stage": 1}}, "does not combine with sharding.stage=1"),
    ({"tensor_parallel_degree": 2, "hierarchical_allreduce": True}, "does not combine with hierarchical_allreduce"),
])
def test_tensor_parallel_options_that_cannot_work_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Strategy(**kwargs)


def test_pipeline_and_hierarchical_meshes():
    mesh = make_mesh(Strategy(pp_degree=2))
    assert dict(mesh.shape) == {"pp": 2, "dp": 4} and dp_axes(mesh) == ("dp",)
    mesh = make_mesh(Strategy(hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=2))
    assert dict(mesh.shape) == {"inter": 2, "intra": 4} and dp_size(mesh) == 8
    # neighbouring devices form a node
    assert [d.id for d in mesh.devices[0]] == [d.id for d in jax.devices()[:4]]


@pytest.mark.parametrize("kwargs, message", [
    ({"dp_degree": 4}, "pp_degree 1 x dp_degree 4 x expert_parallel_degree 1 x tensor_parallel_degree 1 = 4 devices, but there are 8"),
    ({"pp_degree": 3}, "pp_degree 3 x expert_parallel_degree 1 x tensor_parallel_degree 1 does not divide the device count 8"),
    ({"tensor_parallel_degree": 3}, "x tensor_parallel_degree 3 does not divide"),
    ({"tensor_parallel_degree": 2, "dp_degree": 2}, "dp_degree 2 x expert_parallel_degree 1 x tensor_parallel_degree 2 = 4 devices"),
    ({"hierarchical_allreduce": True, "hierarchical_allreduce_inter_nranks": 3},
     "hierarchical_allreduce_inter_nranks: 3 does not divide the data-parallel size 8"),
    ({"sharding": {"stage": 1, "degree": 4}}, "sharding.degree: 4 must equal the data-parallel size 8"),
])
def test_degrees_that_do_not_fit_the_devices_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(Strategy(**kwargs))
