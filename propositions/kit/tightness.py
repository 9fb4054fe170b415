"""Why a bound cannot be tighter: the notes a check carries when its median residual/bound is small.

A check whose median residual/bound is below propositions.kit.common.TIGHTNESS_THRESHOLD (10^-3)
must say why its bound cannot be tighter, or the certificate lists it as loose. These are the
reasons that recur; a check with a reason of its own writes it next to its bound.
"""

EQUALITY = (
    "an equality check: the residual is 0 whenever the code is right (a bound of 0.5 ulp, or 0.5 on "
    "an integer, means exactly equal), so the median is 0 by design and no tighter bound exists"
)

INEQUALITY = (
    "a one-sided check: the residual is the amount by which the inequality is violated, 0 wherever it "
    "holds with room to spare (most samples); the bound covers the rounding of the samples at the edge"
)

SAME_ROUNDING = (
    "for most samples both sides are computed by the same float64 operations in the same order and "
    "agree bit for bit (residual 0); the bound is set by the samples whose roundings differ, which it "
    "must cover (their worst ratio is recorded)"
)

WORST_CASE_SUMS = (
    "the bound is the worst case of Higham's analysis, gamma_n = n u for a sum of length n, attained "
    "only when every rounding error has the same sign and size; independent roundings give about "
    "sqrt(n) u, so the median ratio falls like 1/sqrt(n) over the shape grid (n up to d r = 131072); "
    "how close the worst sample comes is the check's recorded worst ratio (max_ratio, with the sample "
    "that attains it in worst_case)"
)

RUNNING_BOUND = (
    "a running first-order bound over several steps that adds each stage's worst-case rounding "
    "(gamma_n = n u for sums of length n) and propagates it; independent roundings partly cancel "
    "(about sqrt(n) u per sum, and across steps), so the typical sample sits far below the bound; "
    "how close the worst sample comes is the check's recorded worst ratio (max_ratio, with the sample "
    "that attains it in worst_case)"
)

RANDOM_DIRECTION = (
    "the residual is the error's component along one random unit direction, while the bound covers "
    "the error's whole norm (Cauchy-Schwarz: the direction could be aligned with it); a random "
    "direction in a space of dimension k sees about 1/sqrt(k) of it, on top of the worst-case sums "
    "(gamma_n = n u against about sqrt(n) u)"
)

INDICATOR = (
    "an indicator (1 where the first-order bound does not exist, 0 elsewhere): 0 for every sample of "
    "a well-behaved optimizer by design"
)
