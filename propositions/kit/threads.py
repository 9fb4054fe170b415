"""One torch thread and one BLAS thread for the duration of a claim that drives torch."""

from __future__ import annotations


class one_thread:
    """torch (intra-op) and the BLAS libraries (numpy's, via threadpoolctl) on one thread for the
    duration of a block, restored after.

    One thread pins the order of every reduction, so a certificate does not depend on how many
    threads the machine offers. It is also the fast choice here: the claims that drive torch do so
    on small batches, for which a thread team on a loaded two-core machine costs milliseconds per
    call in wake-ups.
    """

    def __enter__(self):
        import torch
        from threadpoolctl import threadpool_limits

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.blas = threadpool_limits(limits=1, user_api="blas")
        return self

    def __exit__(self, *exc):
        import torch

        self.blas.restore_original_limits()
        torch.set_num_threads(self.threads)
        return False


def one_thread_environment(ctx=None) -> one_thread:
    """one_thread as a claim's environment (Claim.environment: a module-level function of the context)."""
    return one_thread()


__all__ = ["one_thread", "one_thread_environment"]
