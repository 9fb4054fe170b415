"""Implementations from outside the project behind the claims' interface: `adapters` (a NumPy step or
a torch.optim.Optimizer, the shortcuts of `certify compare`), `probes` (what an implementation's
first step measurably does) and `compare` (the implementation x claim matrix). docs/adapters.md."""
