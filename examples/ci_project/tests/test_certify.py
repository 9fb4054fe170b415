import pytest


def test_numpy_step_is_steepest_descent(certify_claim):
    certify_claim("P1", implementation="mystep:init,step")


def test_numpy_step_is_scale_free(certify_claim):
    certify_claim("P2", implementation="mystep:init,step")


@pytest.mark.certify("P1", torch_optimizer="mytorch:MyStiefelAdam")
def test_torch_optimizer_is_steepest_descent():
    pass


def test_float32_step_is_steepest_descent(certify_claim):
    certify_claim("P1", implementation="mystep32:init,step")


def test_float32_step_is_scale_free(certify_claim):
    certify_claim("P2", implementation="mystep32:init,step")


def test_numpy_step_is_left_equivariant(certify_property):
    certify_property("P4-left", implementation="mystep:init,step")
