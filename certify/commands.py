"""The commands of `certify` other than running and verifying claims (certify.run): `list`, `cite`,
`compare` (with --properties), `run --properties`, `regression` and `mutate`. Each takes the parsed
arguments, the Output and the command line, and returns the exit code; certify.cli parses and
dispatches.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import propositions
from certify import UsageError
from certify import certificate as certificate_format
from certify import claims
from certify.render import Output, error_line, print_counterexamples
from certify.run import command_run, fresh_folder, output_folder, resolve_implementation


def command_list(args, out: Output, command: str) -> int:
    rows = []
    for claim_id in claims.ALL_IDS:
        try:
            claim = claims.lookup_claim(claim_id)
        except Exception as error:
            rows.append([claim_id, f"(cannot be loaded: {claims.describe_error(error)})", "-"])
            continue
        missing = claims.missing_requirements(claim)
        title = claim.title + (f" (skipped: {', '.join(missing)} not installed)" if missing else "")
        rows.append([claim_id, title, ", ".join(claim.control_names) or "-"])
    for module, problem in propositions.discover()[1].items():
        rows.append([module, f"(cannot be imported: {problem})", "-"])
    out.table(["id", "title", "controls"], rows)
    return 0


def command_cite(args, out: Output, command: str) -> int:
    certificate = certificate_format.load(Path(args.file))
    for line in certificate_format.citation(certificate, args.format).splitlines():
        out.line(line)
    return 0 if certificate["verdict"] == "pass" else 1


def command_mutate(args, out: Output, command: str) -> int:
    import os

    from certify import mutation

    if args.report_only and args.only:
        raise UsageError("--only tests mutants, --report-only tests none: give one of them")
    target = getattr(args, "target", "reference_impl")
    if target != "reference_impl" and args.only:
        raise UsageError("--only names mutants of reference_impl: it does not go with --target " + target)
    if target == "reference_impl" and getattr(args, "sample", None) is not None:
        raise UsageError("--sample draws mutants of torch_impl or the certifier: reference_impl's run tests every mutant")
    out_dir = output_folder(args.out)
    children = args.max_children or os.cpu_count() or 1
    runners = {"reference_impl": _mutate_reference, "torch_impl": _mutate_torch, "certifier": _mutate_certifier}
    try:
        code = runners[target](args, out, command, out_dir, children)
    except mutation.MissingTool as error:
        raise UsageError(str(error)) from None
    except (mutation.MutationError, OSError) as error:
        error_line(str(error))
        return 1
    try:
        page = mutation.write_page(out_dir)
    except OSError as error:
        raise UsageError(f"cannot write the mutation report in {out_dir}: {error.strerror or error}") from None
    out.line(f"report: {page}")
    return code


def _mutate_reference(args, out: Output, command: str, out_dir: Path, children: int) -> int:
    from certify import mutation

    summary = mutation.mutate(max_children=children, resume=args.resume, report_only=args.report_only, command=command, progress=out.line, only=args.only)
    try:
        json_path = mutation.write_json(summary, out_dir)
    except OSError as error:
        raise UsageError(f"cannot write the mutation report in {out_dir}: {error.strerror or error}") from None
    totals, classes = summary["totals"], summary["survivor_classes"]
    out.table(["module", "killed", "survived", "timeout", "suspicious", "other", "total"], [[name, *(c[k] for k in ("killed", "survived", "timeout", "suspicious", "other", "total"))] for name, c in summary["modules"].items()], title="mutants")
    score = "-" if totals["score"] is None else f"{100 * totals['score']:.1f}%"
    out.line(f"score {totals['killed']}/{totals['total']} = {score}; not killed: {classes['equivalent']} equivalent, {classes['validation']} validation, {classes['control']} control, {classes['sampler']} sampler, {classes['gap']} gap, {classes['detected']} timeout, {classes['unclassified']} unclassified")
    out.line(f"results: {json_path}")
    return 0 if not mutation.unexplained(summary) else 1


def _mutate_torch(args, out: Output, command: str, out_dir: Path, children: int) -> int:
    from certify import mutation, mutation_torch

    sample = mutation_torch.DEFAULT_SAMPLE if args.sample is None else args.sample
    summary = mutation_torch.mutate(sample=sample, seed=args.seed, max_children=children, resume=args.resume, report_only=args.report_only,
                                    command=command, progress=out.line)
    try:
        json_path = mutation_torch.write_report(summary, out_dir)
    except OSError as error:
        raise UsageError(f"cannot write the mutation report in {out_dir}: {error.strerror or error}") from None
    out.table(["module", "killed", "survived", "timeout", "suspicious", "other", "total"], [[name, *(c[k] for k in ("killed", "survived", "timeout", "suspicious", "other", "total"))] for name, c in summary["modules"].items()], title="sampled mutants of torch_impl")
    low_high = summary["score_interval"]
    interval = "" if not low_high else f" (95% interval {100 * low_high[0]:.1f}% to {100 * low_high[1]:.1f}%)"
    score = "-" if summary["score"] is None else f"{100 * summary['score']:.1f}%"
    out.line(f"sample {summary['sample']['size']} of {summary['sample']['population']} (seed {summary['sample']['seed']}): score {summary['killed']}/{summary['total']} = {score}{interval}; "
             f"not killed: {summary['equivalent']} equivalent, {summary['explained'] - summary['equivalent']} validation, {summary['gaps']} gap, {summary['unclassified']} unclassified")
    out.line(f"results: {json_path}")
    return 0 if not mutation.unexplained(summary) else 1


def _mutate_certifier(args, out: Output, command: str, out_dir: Path, children: int) -> int:
    from certify import weakening  # written apart; it writes out_dir/mutation-certifier.json itself

    if args.resume or args.report_only:
        raise UsageError("--resume and --report-only go with --target reference_impl or torch_impl")
    summary = weakening.run(Path(out_dir), max_children=children, sample=args.sample, seed=args.seed, progress=out.line)
    score = summary.get("score")
    out.line(f"certifier: {summary.get('killed')} killed of {summary.get('total')}" + ("" if score is None else f" = {100 * score:.1f}%"))
    return 0 if not summary.get("survived") else 1


def command_compare(args, out: Output, command: str) -> int:
    from certify.outside import compare, probes

    specs = list(args.implementations) + [f"numpy:{x}" for x in args.implementation] + [f"torch:{x}" for x in args.torch_optimizer]
    if not specs:
        raise UsageError("name at least one implementation to compare (e.g. certify compare reference_impl torch_impl)")
    specs = list(dict.fromkeys(specs))
    if args.table and not args.properties:
        raise UsageError("--table writes the property matrix: give it with --properties")
    if args.properties:
        out_dir = args.out if args.out is not None else str(fresh_folder("properties"))
        return command_properties(specs, claims.IMPLEMENTATION_CLAIMS, out_dir, args.seed, out, command, table=args.table, profile=args.profile)
    variants = {spec: resolve_implementation(spec) for spec in specs}  # unusable input: exit 2 before any run
    out_dir = output_folder(args.out if args.out is not None else str(fresh_folder("compare")))
    results, wall_seconds = compare.run(specs, out_dir=out_dir, seed=args.seed, profile=args.profile, command=command, progress=out.line)
    found = {}
    for spec, variant in variants.items():
        if getattr(variant, "dtype", "float64") == "float64":
            found[spec] = probes.probe(variant, seed=args.seed)
    text = compare.markdown(results, found, seed=args.seed, profile=args.profile, wall_seconds=wall_seconds, command=command)
    try:
        path = compare.write_matrix(out_dir, text)
    except OSError as error:
        raise UsageError(f"cannot write the report in {out_dir}: {error.strerror or error}") from None
    out.table(["implementation", *claims.COMPARE_CLAIMS], compare.matrix_rows(results), title="implementations x claims")
    print_counterexamples(out, results)
    for spec, listed in found.items():
        differing = [f"{p['property']}: {p['finding']}" for p in listed if p["differs"]]
        if differing:
            out.line(f"{spec} differs from StiefelAdam in: " + "; ".join(differing))
    out.line(f"report: {path}; certificates under {out_dir / 'compare'} ({wall_seconds:.1f} s)")
    # a pair whose claim does not apply is its own outcome: compare exits 0 when every applicable pair passes
    applicable = [c for spec in specs for c in results[spec].values() if c["verdict"] != claims.NOT_APPLICABLE]
    return 0 if all(c["verdict"] == "pass" for c in applicable) else 1


def command_properties(specs: list[str], claim_ids, out_text: str, seed: int, out: Output, command: str, table: str | None = None,
                       profile: str = "default") -> int:
    """The property verdicts of `specs` for the claims or properties `claim_ids` (certify.outside.properties),
    at the profile's regimes: the matrix printed and written into OUT/REPORT.md, one sealed certificate
    per property and implementation under OUT/properties/<implementation>/.
    Exit 0 when every property asked holds for every implementation, 1 when one fails, is vacuous or
    untested, 2 for an implementation that cannot be used (before anything runs)."""
    from certify.outside import adapters, properties

    canonical = [adapters.canonical_spec(spec) if spec != claims.DEFAULT_OPTIMIZER else spec for spec in specs]
    try:
        variants = {spec: properties.resolve(spec) for spec in canonical}
    except adapters.AdapterError as error:
        raise UsageError(str(error)) from None
    out_dir = output_folder(out_text)
    table_path = _table_path(table) if table else None
    from certify import environment as environment_record

    records, control_records, wall_seconds = properties.run(variants, seed=seed, claim_ids=claim_ids, out_dir=out_dir, profile=profile,
                                                            command=command, git=environment_record.git_state(), progress=out.line)
    text = properties.markdown(records, control_records, seed=seed, wall_seconds=wall_seconds, command=command)
    try:
        path = properties.write(out_dir, text)
    except OSError as error:
        raise UsageError(f"cannot write the report in {out_dir}: {error.strerror or error}") from None
    first = next(iter(records.values()))
    header = ["implementation"] + [properties.HEADERS[v["property"]] for v in first["properties"]] + ["StiefelAdam's step"]
    out.table(header, properties.matrix_rows(records), title="which optimizer has which property")
    for spec, record in records.items():
        out.line(f"{spec}: StiefelAdam's step: {record['stiefel_adam_step']['text']}")
    out.line(f"report: {path}; certificates under {out_dir / 'properties'} ({wall_seconds:.1f} s)")
    if table_path is not None:
        properties.write_table(table_path, properties.table(records, command=command))
        out.line(f"table: {table_path}")
    return 0 if all(v["verdict"] == "holds" for record in records.values() for v in record["properties"]) else 1


def _table_path(text: str) -> Path:
    """The --table page, checked before anything runs: it exists and holds the table markers."""
    from certify.outside import properties

    path = Path(text)
    try:
        existing = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--table {text}: cannot be read ({error.strerror or error})") from None
    if properties.TABLE_BEGIN not in existing or properties.TABLE_END not in existing:
        raise UsageError(f"--table {text}: has no {properties.TABLE_BEGIN} ... {properties.TABLE_END} markers (put them where the table goes)")
    return path


def command_run_or_properties(args, out: Output, command: str) -> int:
    """`certify run`, or with --properties the property verdicts of the claims named (P1..P5)."""
    if not args.properties:
        return command_run(args, out, command)
    from certify.run import _optimizer_from_args

    ids = [property_or_claim_id(text) for text in args.ids]
    explicit_out = any(token == "--out" or token.startswith("--out=") for token in shlex.split(command))
    out_dir = args.out if explicit_out else str(fresh_folder("properties"))
    return command_properties([_optimizer_from_args(args)], tuple(dict.fromkeys(ids)), out_dir, args.seed, out, command, profile=args.profile)


def property_or_claim_id(text: str) -> str:
    """A property id (P4-left, case as the user likes) or a claim id of IMPLEMENTATION_CLAIMS (its properties)."""
    from propositions.properties import PROPERTY_IDS

    for property_id in PROPERTY_IDS:
        if text.lower() == property_id.lower():
            return property_id
    try:
        claim_id = claims.normalise_id(text)
    except claims.UnknownClaim as error:
        raise UsageError(str(error)) from None
    if claim_id not in claims.IMPLEMENTATION_CLAIMS:
        raise UsageError(f"{claim_id} states no property of an optimizer's step; --properties takes {', '.join(claims.IMPLEMENTATION_CLAIMS)} "
                         f"or a property ({', '.join(PROPERTY_IDS)})")
    return claim_id


def command_regression(args, out: Output, command: str) -> int:
    from certify.ci import regression

    target = Path(args.output)
    if target.is_dir() or not target.parent.is_dir():
        raise UsageError(f"-o {args.output}: " + ("is a directory" if target.is_dir() else f"directory {target.parent} does not exist"))
    try:
        count = regression.write(args.files, target)
    except regression.RegressionError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot write {target}: {error.strerror or error}") from None
    out.line(f"{target}: {count} counterexample(s); run it with: python -m pytest {target}")
    return 0
