"""The coverage contract: how much evidence each certificate of the real optimizer must hold.

A claim decides what it samples from its own constants (shape lists, dtypes, steps, frames, seeds).
Narrow one of them, drop a shape or a dtype, halve the steps, and every check still passes on what
is left: the certificate says "pass" on less than it says. The contract is the second statement that
such a narrowing must disagree with: for each profile, claim and check, the shapes it must sample and
the samples it must hold, written once from full runs (`python -m propositions.coverage_contract`,
below) and committed in coverage_contract.json. A certificate of the real optimizer at a contracted
profile, with the claim's default options, is inconclusive when

* a contracted check is missing or holds no sample;
* it sampled none of the frames of a contracted shape;
* it holds fewer samples than contracted: the count where every seed the contract was written from
  gave the same count (the count is then fixed by the code, not by the draws), else one (a count the
  draws move, as in drawn scenarios, may be far smaller at another seed);
* its smallest or its largest bound rose above the one that those seeds all gave (up to
  FIXED_BOUND_SLACK: a bound the code fixes), or more than RATIO_SLACK above the largest they gave
  where they gave different ones that agree within STABLE (a bound loosened, a significance level
  lowered: the residuals need not move);
* its largest residual/bound fell more than RATIO_SLACK below the least that those seeds reached
  (a bound loosened, or draws that no longer reach it), for a check whose count is fixed and whose
  largest ratio those seeds agree on within STABLE; more than UNSTABLE_SLACK below it where they do
  not agree so closely (residuals made 0: a run compared with itself);
* a drawn parameter the check records (NumericalCheck.reach: a weight decay, a scale, a condition
  number, a step count) reached less far than those seeds all reached, by more than REACH_SLACK of
  the span they agree on (a range cut short): held where the seeds' ends agree within REACH_STABLE
  of that span;
* a categorical parameter the check records (NumericalCheck.cover: a dtype mix, a norm type, a
  form) took none of a value that every one of those seeds took;
* the alphabets its drawn scenarios take values from (extra.grammar: the optimizer claim's frame
  shapes, leading axes, settings and features) lack a value they held at those seeds;
* a group of its draws (the draw ledger: the first two labels of an rng_for key) asked for fewer
  distinct keys than those seeds did: exactly as many where every seed gave the same count, else at
  least the least of them over STABLE; the same for its controls' draws (extra.control_draw_keys),
  counted apart. A key that lost the part that varies per shape, dtype, chunk
  or step draws the same numbers for what were independent draws, and the count falls.

At the seeds the contract was written from, a certificate is also held to what that very seed gave
(`at_seed`): each check's samples at least AT_SEED_SLACK below that seed's count, its smallest and
largest bound at most AT_SEED_SLACK above that seed's, and each draw group's distinct keys at least
AT_SEED_SLACK below that seed's. The drawn scenarios' counts and bounds move from seed to seed, so
the seed-free terms above hold them loosely; at the same seed they reproduce, and a bound loosened
tenfold or a key that lost one label (a few per cent fewer keys) falls short. The slack leaves room
for a frame or two that another machine's rounding decides differently.

A certificate's figures are held by their size: each series of a figure (a series' x values, or a
figure's own) has at least as many points as it had at every seed the contract was written from,
where those seeds all gave the same count (a count the code fixes: the steps a figure follows, the
grid it plots); a figure or series missing is a shortfall too. The figures are what a reader of
REPORT.md sees of a claim beyond its verdict, and a figure cut short shows less than it says.

The symbolic tier is held by what it states: each step's description (which names the shapes it was
derived at) that every seed gave must still be among the certificate's symbolic steps (a shape
dropped from a derivation changes its description; a step removed is missing). The exact tier
states its own cases.
A profile the contract does not name (thorough, a test's own) is not held to it. Changing what a
claim samples on purpose means writing the contract again, and its diff shows what moved.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path

CONTRACT_FILE = Path(__file__).with_name("coverage_contract.json")
SEEDS = (0, 1, 2)  # the seeds the committed contract is written from
# A bound loosened tenfold passes everything it passed before. Its check's largest residual/bound
# then falls tenfold: the contract holds each bounded check's largest ratio to RATIO_SLACK below the
# smallest it reached over SEEDS (the draws move it less than that), where that ratio shows the bound
# at work (above RATIO_FLOOR; exact checks, whose residuals are 0, and bounds far from attained are
# held to their shapes and counts only).
RATIO_SLACK = 4.0
RATIO_FLOOR = 1e-3
# counts and ratios that moved by more than this factor between the seeds are held loosely (above)
STABLE = 2.0
# a bound every seed gave the same is fixed by the code: held to it, up to a float64 evaluation's
# rounding of the same formula on another machine (a few ulps), far below any change of a constant
FIXED_BOUND_SLACK = 1e-9
# what one seed gave is held at that seed up to this share (a borderline frame decided otherwise by
# another machine's rounding moves a count by one in thousands; a tenfold bound, or a dropped label,
# by far more)
AT_SEED_SLACK = 0.01
UNSTABLE_SLACK = 100.0
# a drawn parameter's ends may fall short of the contracted ends by this share of their span (draws
# near a range's ends move a little from seed to seed; a range cut to half its span moves an end by a
# quarter of it), and are contracted only where the seeds' ends agree within REACH_STABLE of the span
REACH_SLACK = 0.1
REACH_STABLE = 0.05


@functools.lru_cache(maxsize=4)
def _parsed(path: str, modified_ns: int, size: int) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _contract(path: Path) -> dict | None:
    """The contract file parsed once per version of it (its path, modification time and size): every
    certificate of a run reads several of its sections. Read only: main() copies what it changes."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


def load(path: Path = CONTRACT_FILE) -> dict:
    contract = _contract(path)
    return {} if contract is None else contract["profiles"]


def load_section(section: str, path: Path = CONTRACT_FILE) -> dict:
    """{profile: {claim: ...}} of one section of the committed contract ("draws", "grammar")."""
    contract = _contract(path)
    return {} if contract is None else contract.get(section, {})


def load_draws(path: Path = CONTRACT_FILE) -> dict:
    """{profile: {claim: {draw group: {"keys", "fixed"}}}} of the committed contract."""
    return load_section("draws", path)


def _reach_contract(spans: list[list[list[float]]]) -> dict | None:
    """The ends every seed reached ([low, high] per seed): low at most the largest low, high at least
    the smallest high, with REACH_SLACK of the span as give; None where the seeds disagree."""
    lows, highs = [float(s[0]) for s in spans], [float(s[1]) for s in spans]
    low, high = max(lows), min(highs)
    span = high - low
    if not all(math.isfinite(x) for x in lows + highs) or span < 0:
        return None
    if span > 0 and (max(lows) - min(lows) > REACH_STABLE * span or max(highs) - min(highs) > REACH_STABLE * span):
        return None
    if span == 0 and (len(set(lows)) > 1 or len(set(highs)) > 1):
        return None
    return {"low_at_most": low + REACH_SLACK * span, "high_at_least": high - REACH_SLACK * span}


def _bound_contract(bounds: list) -> dict:
    """The smallest and largest bound a check may give ({"min_at_most", "max_at_most"}): where every
    seed gave the same value (a bound the code fixes, not the draws: 0.5 ulp, -log10 of a significance
    level, a bound at fixed arguments) that value, up to FIXED_BOUND_SLACK; else RATIO_SLACK above the
    largest the seeds gave, where they agree on it within STABLE."""
    contract = {}
    for index, label in ((0, "min_at_most"), (1, "max_at_most")):
        values = [b[index] for b in bounds]
        if not values or any(not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0 for v in values):
            continue
        if max(values) <= (1.0 + FIXED_BOUND_SLACK) * min(values):
            contract[label] = max(values) * (1.0 + FIXED_BOUND_SLACK)
        elif max(values) <= STABLE * min(values):
            contract[label] = max(values) * RATIO_SLACK
    return contract


def written_draws(certificates: list[dict], field: str = "draw_keys") -> dict:
    """The draw ledger's contract of one profile and claim from its certificates at several seeds:
    per group the distinct keys (exact where every seed gave the same count, else the least over STABLE).
    field: "draw_keys" (the claim's own tiers and parts) or "control_draw_keys" (its controls')."""
    counts: dict = {}
    seeds: dict = {}
    for certificate in certificates:
        seed = (certificate.get("numerical") or {}).get("seed")
        for group, keys in (certificate.get("extra", {}).get(field) or {}).items():
            counts.setdefault(group, []).append(int(keys))
            if seed is not None:
                seeds.setdefault(group, {})[str(seed)] = int(keys)
    contract = {}
    for group, found in sorted(counts.items()):
        if len(found) != len(certificates):
            continue
        fixed = len(set(found)) == 1
        contract[group] = {"keys": found[0] if fixed else max(1, int(min(found) // STABLE)), "fixed": fixed}
        if not fixed and len(seeds.get(group, {})) == len(certificates):
            contract[group]["at_seed"] = seeds[group]
    return contract


def written_grammar(certificates: list[dict]) -> dict:
    """The alphabets a claim's drawn scenarios take their values from (extra.grammar), where every
    seed gave the same: {alphabet: [value, ...]} as JSON text per value."""
    found = [certificate.get("extra", {}).get("grammar") for certificate in certificates]
    if not found or any(g is None for g in found) or any(g != found[0] for g in found):
        return {}
    return {name: [json.dumps(value, sort_keys=True) for value in values] for name, values in sorted(found[0].items())}


def written_symbolic(certificates: list[dict]) -> list[str]:
    """The descriptions of the symbolic steps every certificate states (a claim's symbolic tier is the
    same at every seed)."""
    found = [{step.get("description") for step in (certificate.get("symbolic") or {}).get("steps") or []} for certificate in certificates]
    return sorted(set.intersection(*found) - {None}) if found else []


def _figure_sizes(figures: dict | None) -> dict:
    """{"figure" or "figure/series label": number of x values} of a certificate's figures."""
    sizes = {}
    for name, figure in (figures or {}).items():
        if not isinstance(figure, dict):
            continue
        if isinstance(figure.get("x"), list):
            sizes[name] = len(figure["x"])
        for index, series in enumerate(figure.get("series") or []):
            if isinstance(series, dict) and isinstance(series.get("x"), list):
                sizes[f"{name}/{series.get('label', index)}"] = len(series["x"])
    return sizes


def written_figures(certificates: list[dict]) -> dict:
    """The figures' contract of one profile and claim: each series whose size every seed gave alike."""
    found = [_figure_sizes(certificate.get("figures")) for certificate in certificates]
    if not found:
        return {}
    return {key: size for key, size in sorted(found[0].items()) if all(sizes.get(key) == size for sizes in found)}


def figure_shortfalls(claim_id: str, profile: str, figures: dict | None, contract: dict | None = None) -> list[str]:
    """Why a certificate's figures show fewer points than the contract's (empty: none)."""
    contract = load_section("figures") if contract is None else contract
    wanted = contract.get(profile, {}).get(claim_id) or {}
    have = _figure_sizes(figures)
    reasons = []
    for key, size in wanted.items():
        if key not in have:
            reasons.append(f"coverage contract: the figure series {key!r} is missing")
        elif have[key] < size:
            reasons.append(f"coverage contract: the figure series {key!r} has {have[key]} points, fewer than {size}")
    return reasons


def symbolic_shortfalls(claim_id: str, profile: str, symbolic: dict | None, contract: dict | None = None) -> list[str]:
    """Why a certificate's symbolic tier states less than the contract's (empty: none)."""
    contract = load_section("symbolic") if contract is None else contract
    wanted = contract.get(profile, {}).get(claim_id) or []
    stated = {step.get("description") for step in (symbolic or {}).get("steps") or []}
    return [f"coverage contract: the symbolic tier no longer states {description!r} (a step removed, or derived at fewer shapes)"
            for description in wanted if description not in stated]


def grammar_shortfalls(claim_id: str, profile: str, grammar: dict | None, contract: dict | None = None) -> list[str]:
    """Why a certificate's scenarios draw from smaller alphabets than the contract's (empty: none)."""
    contract = load_section("grammar") if contract is None else contract
    wanted = contract.get(profile, {}).get(claim_id)
    if not wanted:
        return []
    reasons = []
    for name, values in wanted.items():
        have = {json.dumps(value, sort_keys=True) for value in (grammar or {}).get(name, [])}
        lacking = [value for value in values if value not in have]
        if lacking:
            reasons.append(f"coverage contract: the scenarios' alphabet {name} lacks {', '.join(lacking)}: they can no longer draw it")
    return reasons


def draw_shortfalls(claim_id: str, profile: str, draw_keys: dict, contract: dict | None = None, section: str = "draws",
                    seed: int | None = None) -> list[str]:
    """Why a certificate's draw ledger (extra.draw_keys; with section "control_draws", its controls'
    extra.control_draw_keys) holds fewer independent draws than the contract (empty: none, or no
    contract for that profile and claim)."""
    contract = load_section(section) if contract is None else contract
    wanted = contract.get(profile, {}).get(claim_id)
    if not wanted:
        return []
    reasons = []
    for group, entry in wanted.items():
        found = int((draw_keys or {}).get(group, 0))
        at_seed = (entry.get("at_seed") or {}).get(str(seed))
        if at_seed is not None and found < (1.0 - AT_SEED_SLACK) * at_seed:
            reasons.append(f"coverage contract: {'control ' if section == 'control_draws' else ''}draw group {group} asked rng_for for "
                           f"{found} distinct keys, fewer than the {at_seed} this seed ({seed}) gave when the contract was written: "
                           "draws that were independent now share a stream")
            continue
        if found < entry["keys"]:
            how = "at every seed the contract was written from" if entry["fixed"] else "at least"
            reasons.append(f"coverage contract: {'control ' if section == 'control_draws' else ''}draw group {group} asked rng_for for {found} distinct keys, fewer than the "
                           f"{entry['keys']} contracted ({how}): draws that were independent now share a stream")
    return reasons


def _shape_key(shape) -> str:
    return "x".join(str(int(n)) for n in shape)


def written(certificates: list[dict]) -> dict:
    """The contract of one profile and claim from its certificates at several seeds: per check the
    shapes every seed sampled, and the samples (exact where every seed gave the same count)."""
    by_check: dict = {}
    for certificate in certificates:
        for check in certificate["numerical"]["checks"]:
            entry = by_check.setdefault(check["name"], {"shapes": [], "counts": [], "ratios": []})
            seed = (certificate.get("numerical") or {}).get("seed")
            if seed is not None:
                bound = check.get("bound") or {}
                entry.setdefault("at_seed", {})[str(seed)] = {"samples": int(check["samples"]), "bound": [bound.get("min"), bound.get("max")]}
            entry["shapes"].append({_shape_key(s) for s in check.get("shapes") or []})
            entry["counts"].append(int(check["samples"]))
            ratio = check.get("max_ratio")
            entry["ratios"].append(float(ratio) if isinstance(ratio, (int, float)) else math.nan)
            bound = check.get("bound") or {}
            entry.setdefault("bounds", []).append((bound.get("min"), bound.get("max")))
            entry.setdefault("reach", []).append(check.get("reach") or {})
            entry.setdefault("covers", []).append({name: set(values) for name, values in (check.get("covers") or {}).items()})
    contract = {}
    for name, entry in by_check.items():
        if len(entry["counts"]) != len(certificates) or min(entry["counts"]) == 0:
            continue  # a check that some seed does not make, or fills with nothing, is not contracted
        shapes = sorted(set.intersection(*entry["shapes"]))
        counts, ratios = entry["counts"], entry["ratios"]
        fixed = len(set(counts)) == 1
        # a count the draws move (the optimizer claim's drawn scenarios, frames whose bound is
        # informative) is held to be non-zero only: another seed may draw far fewer than these did
        samples = counts[0] if fixed else 1
        contract[name] = {"shapes": shapes, "samples": samples, "fixed": fixed}
        if fixed and all(math.isfinite(x) for x in ratios) and min(ratios) > RATIO_FLOOR:
            # a largest ratio the seeds agree on is held to RATIO_SLACK below their least (a bound loosened
            # tenfold falls under it); one that moves more between them, to UNSTABLE_SLACK below: no
            # longer a guard against a looser bound, still one against residuals made 0 (a comparison of
            # the run with itself, a check fed nothing but exact zeros)
            slack = RATIO_SLACK if max(ratios) <= STABLE * min(ratios) else UNSTABLE_SLACK
            contract[name]["max_ratio_at_least"] = min(ratios) / slack
        if entry.get("at_seed") and len(entry["at_seed"]) == len(certificates):
            contract[name]["at_seed"] = entry["at_seed"]
        bounds = _bound_contract(entry.get("bounds") or [])
        if bounds:
            contract[name]["bound"] = bounds
        reached = entry.get("reach") or []
        common = set.intersection(*(set(r) for r in reached)) if reached else set()
        reach = {parameter: _reach_contract([r[parameter] for r in reached]) for parameter in sorted(common)}
        reach = {parameter: ends for parameter, ends in reach.items() if ends is not None}
        if reach:
            contract[name]["reach"] = reach
        covered = entry.get("covers") or []
        names = set.intersection(*(set(c) for c in covered)) if covered else set()
        covers = {category: sorted(set.intersection(*(c[category] for c in covered))) for category in sorted(names)}
        if covers:
            contract[name]["covers"] = covers
    return contract


def shortfalls(claim_id: str, profile: str, checks: list[dict], contract: dict | None = None, seed: int | None = None) -> list[str]:
    """Why a certificate of claim_id at `profile` holds less evidence than the contract (empty: none,
    or no contract for that profile and claim)."""
    contract = load() if contract is None else contract
    wanted = contract.get(profile, {}).get(claim_id)
    if not wanted:
        return []
    found = {check["name"]: check for check in checks}
    reasons = []
    for name, entry in wanted.items():
        check = found.get(name)
        if check is None or not check.get("samples"):
            reasons.append(f"coverage contract: check {name} is missing or compared nothing (contracted: {entry['samples']} samples)")
            continue
        sampled = {_shape_key(s) for s in check.get("shapes") or []}
        missing = [s for s in entry["shapes"] if s not in sampled]
        if missing:
            reasons.append(f"coverage contract: check {name} sampled no frame of shape {', '.join('(' + s.replace('x', ', ') + ')' for s in missing)}")
        floor = entry.get("max_ratio_at_least")
        ratio = check.get("max_ratio")
        if floor is not None and isinstance(ratio, (int, float)) and ratio < floor:
            reasons.append(f"coverage contract: check {name} reached at most {ratio:.3g} of its bound, below the {floor:.3g} contracted "
                           f"(a {RATIO_SLACK:g}th of the least reached at the seeds it was written from): its bound is looser than it was, "
                           "or its draws no longer reach it")
        bound = check.get("bound") or {}
        at_seed = (entry.get("at_seed") or {}).get(str(seed))
        if at_seed is not None:
            if check["samples"] < (1.0 - AT_SEED_SLACK) * at_seed["samples"]:
                reasons.append(f"coverage contract: check {name} holds {check['samples']} samples, fewer than the {at_seed['samples']} "
                               f"this seed ({seed}) gave when the contract was written")
            for index, end in ((0, "min"), (1, "max")):
                then, now = at_seed["bound"][index], bound.get(end)
                if isinstance(then, (int, float)) and isinstance(now, (int, float)) and now > (1.0 + AT_SEED_SLACK) * then:
                    reasons.append(f"coverage contract: check {name}'s {'smallest' if end == 'min' else 'largest'} bound is {now:.3g}, "
                                   f"above the {then:.3g} this seed ({seed}) gave when the contract was written: its bound is looser than it was")
        for label, end in (("min_at_most", "min"), ("max_at_most", "max")):
            limit, value = (entry.get("bound") or {}).get(label), bound.get(end)
            if limit is not None and isinstance(value, (int, float)) and value > limit:
                reasons.append(f"coverage contract: check {name}'s {'smallest' if end == 'min' else 'largest'} bound is {value:.3g}, above the "
                               f"{limit:.3g} contracted ({RATIO_SLACK:g} times the largest at the seeds it was written from): its bound "
                               "is looser than it was")
        for category, values in (entry.get("covers") or {}).items():
            lacking = sorted(set(values) - set((check.get("covers") or {}).get(category, [])))
            if lacking:
                reasons.append(f"coverage contract: check {name} took no {category} {', '.join(lacking)} (contracted: {', '.join(values)})")
        for parameter, ends in (entry.get("reach") or {}).items():
            low, high = (check.get("reach") or {}).get(parameter, [math.inf, -math.inf])
            if low > ends["low_at_most"] or high < ends["high_at_least"]:
                reasons.append(f"coverage contract: check {name} drew {parameter} over [{low:.4g}, {high:.4g}], short of the contracted "
                               f"reach (down to {ends['low_at_most']:.4g}, up to {ends['high_at_least']:.4g}): its range was cut")
        if check["samples"] < entry["samples"]:
            how = "exactly that many at every seed the contract was written from" if entry["fixed"] else "at least one"
            reasons.append(f"coverage contract: check {name} holds {check['samples']} samples, fewer than the {entry['samples']} "
                           f"contracted ({how})")
    return reasons


def main(argv: list[str] | None = None) -> int:
    """python -m propositions.coverage_contract --profile P DIR... : write the contract of profile P
    from the certificates in the directories DIR (one per seed of SEEDS, each a `certify all` at P),
    keeping the other profiles' entries."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m propositions.coverage_contract", description=main.__doc__)
    parser.add_argument("--profile", required=True)
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    per_claim: dict = {}
    for directory in args.dirs:
        for path in sorted(directory.glob("*.json")):
            certificate = json.loads(path.read_text(encoding="utf-8"))
            if "numerical" not in certificate or certificate.get("verdict") != "pass":
                continue
            if certificate["numerical"].get("profile") != args.profile:
                raise SystemExit(f"{path}: profile {certificate['numerical'].get('profile')}, not {args.profile}")
            per_claim.setdefault(certificate["id"], []).append(certificate)
    profiles, draws, grammar, symbolic = copy.deepcopy((load(), load_draws(), load_section("grammar"), load_section("symbolic")))
    control_draws, figures = copy.deepcopy((load_section("control_draws"), load_section("figures")))
    complete = {claim_id: certificates for claim_id, certificates in sorted(per_claim.items()) if len(certificates) == len(args.dirs)}
    profiles[args.profile] = {claim_id: written(certificates) for claim_id, certificates in complete.items()}
    draws[args.profile] = {claim_id: written_draws(certificates) for claim_id, certificates in complete.items()}
    control_draws[args.profile] = {claim_id: found for claim_id, certificates in complete.items()
                                   if (found := written_draws(certificates, "control_draw_keys"))}
    grammar[args.profile] = {claim_id: found for claim_id, certificates in complete.items() if (found := written_grammar(certificates))}
    symbolic[args.profile] = {claim_id: found for claim_id, certificates in complete.items() if (found := written_symbolic(certificates))}
    figures[args.profile] = {claim_id: found for claim_id, certificates in complete.items() if (found := written_figures(certificates))}
    CONTRACT_FILE.write_text(json.dumps({"note": "written by python -m propositions.coverage_contract; see its docstring",
                                         "seeds": list(SEEDS), "profiles": profiles, "draws": draws, "grammar": grammar,
                                         "symbolic": symbolic, "control_draws": control_draws, "figures": figures},
                                        indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{CONTRACT_FILE}: {args.profile}: {sum(len(c) for c in profiles[args.profile].values())} checks of "
          f"{len(profiles[args.profile])} claims")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["AT_SEED_SLACK", "CONTRACT_FILE", "figure_shortfalls", "written_figures", "RATIO_SLACK", "REACH_SLACK", "UNSTABLE_SLACK", "SEEDS", "STABLE", "draw_shortfalls", "grammar_shortfalls", "symbolic_shortfalls", "written_symbolic", "load", "load_draws", "load_section", "shortfalls",
           "written", "written_draws", "written_grammar"]
