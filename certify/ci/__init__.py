"""The claims in a user's own CI: the pytest plugin (`certify_claim`, `@pytest.mark.certify`), the
hypothesis strategies of frames and trajectories, `certify regression` files replaying recorded
counterexamples, and what they rest on: the minimal counterexample of a failing certificate
(`counterexample`) and the first stage of the step that it gets wrong (`stages`). docs/ci.md."""
