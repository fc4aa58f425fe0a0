"""``tidal-actors inspect``: read a data directory, read-only.

Owns the ``inspect`` group and its subcommands (``users``, ``user``, ``cohorts``,
``top``, ``manifests``, ``purge``). ``--data-dir`` is taken after the subcommand
(``inspect user 1 --data-dir D``) or before it (``inspect --data-dir D user 1``,
``tidal-actors --data-dir D inspect user 1``).
The store is opened read-only through ``store.open_db`` (looked up at call time so
that the tests can swap the database for the reference model): read once, in one
LMDB read transaction, beside a writer in another process if there is one (a note
on standard error then says that the output is a consistent snapshot as of that
read), with the settings the store records; nothing is written (a pending
re-materialization stays pending). A store that records no settings is read with
those of the directory's ``tidal-actors-cli.json``, else the defaults, and a note
says which. An unknown cohort is bad input (exit 2), named on standard error with
the closest known names.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tidal_actors._errors import InvalidArgument, UnknownPurge
from tidal_actors._text import plural
from tidal_actors._types import COMMUNITY, MembershipStatus
from tidal_actors.cli import store
from tidal_actors.cli.group import EXIT_BAD_INPUT, Integer, data_dir_of, fail
from tidal_actors.cli.inspect_store import inspected, known_cohorts, note, user_ids
from tidal_actors.cli.timepoints import FORMS, stamp

__all__ = ["inspect"]

ID = Integer(0, 2**64 - 1)
_DATA_DIR_HELP = (
    "A store's directory: one replay or simulate wrote, or any the library wrote "
    "(required; after the "
    "subcommand, or before it: `tidal-actors --data-dir D inspect user 1` and "
    "`tidal-actors inspect --data-dir D user 1` work too)."
)

_AT_HELP = (
    f"Read time: {FORMS}. Default: the last event replayed into the "
    "directory (while a replay runs, the latest one it has written; the wall "
    "clock for a store no replay wrote)."
)

F = TypeVar("F", bound=Callable[..., Any])


def _data_dir_option(f: F) -> F:
    """``--data-dir`` on a subcommand (it is also accepted before the subcommand)."""
    return click.option(
        "--data-dir",
        "data_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help=_DATA_DIR_HELP,
    )(f)


@click.group()
@click.option(
    "--data-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), help=_DATA_DIR_HELP
)
def inspect(data_dir: Path | None) -> None:
    """Read a data directory: its users and cohorts, a user, a cohort's top entities,
    a user's manifests, a purge.

    Read-only, also beside a running writer (a replay, an application): the store is
    read once, and what is shown is a consistent snapshot as of that read. Scores are
    read with the settings the store records. Nothing of the store is written (LMDB
    records the reader in its lock.mdb while it reads)."""
    del data_dir  # each subcommand reads it (`group.data_dir_of`)


# ---------------------------------------------------------------- subcommands


@inspect.command("users")
@_data_dir_option
@click.pass_context
def inspect_users(ctx: click.Context, data_dir: Path | None) -> None:
    """Every user the store holds a record of, with status and cohort count."""
    with inspected(data_dir_of(ctx, data_dir)) as (db, _):
        rows = [
            (u, db.community_layer_status(u).status, len(db.cohorts_of(u))) for u in user_ids(db)
        ]
    left = sum(1 for _, status, _ in rows if status is MembershipStatus.Left)
    out = click.echo
    out(
        f"{plural(len(rows), 'user')}: {len(rows) - left:,} active, {left:,} left "
        "(users with a cohort, a leave or a manifest)"
    )
    width = max([len("user_id")] + [len(str(u)) for u, _, _ in rows])
    out(f"  {'user_id':>{width}}  {'status':<8}{'cohorts':>8}")
    for user, status, n in rows:
        out(f"  {user:>{width}}  {status.name:<8}{n:>8,}")


@inspect.command("user", context_settings={"ignore_unknown_options": True})
@click.argument("user_id", type=ID)
@_data_dir_option
@click.pass_context
def inspect_user(ctx: click.Context, user_id: int, data_dir: Path | None) -> None:
    """USER_ID's status, leave history, cohorts and purge manifests.

    A user the store has no record of (no cohort, leave or manifest) is said to be
    so, exit status 0: a user who only signalled to @community leaves none."""
    with inspected(data_dir_of(ctx, data_dir)) as (db, _):
        known = user_id in user_ids(db)
        membership = db.community_layer_status(user_id)
        history = db.community_leave_history(user_id)
        cohorts = sorted(db.cohorts_of(user_id))
        manifests = db.list_purge_manifests(user_id)
    out = click.echo
    if not known:
        out(
            f"user {user_id}: the store has no record of this user (no cohort, no leave, no "
            "purge manifest)"
        )
        out(
            "  a user who only signalled, to @community alone, leaves no record of their own; "
            "`tidal-actors inspect users` lists the users the store has a record of"
        )
        return
    out(f"user {user_id}")
    out(f"  status         {membership.status.name}")
    left = membership.left_at_ns if membership.status is MembershipStatus.Left else None
    out(f"  left_at_ns     {stamp(left)}")
    out(f"  leave history  {plural(len(history), 'epoch')}")
    for epoch in history:
        rejoined = (
            "still left"
            if epoch.rejoined_at_ns is None
            else f"rejoined {stamp(epoch.rejoined_at_ns)}"
        )
        out(f"    left {stamp(epoch.left_at_ns)}  {rejoined}")
    out(f"  cohorts        {', '.join(cohorts) if cohorts else '(none)'}")
    out(f"  manifests      {len(manifests):,}")
    for m in manifests:
        out(
            f"    {m.purge_id}  cohort {m.cohort}  created {stamp(m.created_at_ns)}  "
            f"{plural(len(m.entries), 'entry', 'entries')}, {m.evicted} evicted"
        )


@inspect.command("cohorts")
@click.option("--at", "at_text", metavar="TIME", help=_AT_HELP)
@_data_dir_option
@click.pass_context
def inspect_cohorts(ctx: click.Context, at_text: str | None, data_dir: Path | None) -> None:
    """Every cohort (and @community) with its members now and its keys at the read
    time (those with a contribution stamped at or before it)."""
    with inspected(data_dir_of(ctx, data_dir), at_text) as (db, at):
        keys, members = known_cohorts(db, at)
    names = sorted(set(keys) | set(members) | {COMMUNITY})
    out = click.echo
    out(
        f"{plural(len(names) - 1, 'cohort')} and {COMMUNITY} at {stamp(at)} "
        "(keys: (entity, signal type) pairs with a contribution at or before it)"
    )
    out(f"  {'cohort':<32}{'members (now)':>14}{'keys':>10}")
    for name in names:
        shown = "-" if name == COMMUNITY else f"{members[name]:,}"
        out(f"  {name:<32}{shown:>14}{keys[name]:>10,}")


@inspect.command("top")
@click.argument("cohort")
@click.option(
    "--type",
    "signal_type",
    type=ID,
    metavar="N",
    help="Signal type id. Default: every type present in the cohort.",
)
@click.option(
    "-k",
    "k",
    type=Integer(1, 2**31 - 1),
    default=10,
    show_default=True,
    metavar="K",
    help="How many entities.",
)
@click.option("--at", "at_text", metavar="TIME", help=_AT_HELP)
@_data_dir_option
@click.pass_context
def inspect_top(
    ctx: click.Context,
    cohort: str,
    signal_type: int | None,
    k: int,
    at_text: str | None,
    data_dir: Path | None,
) -> None:
    """The k highest entities of COHORT (a name or @community) by decay score.

    A cohort the store does not know (no member, no contribution) is an error
    (exit 2) naming the closest known names; `inspect cohorts` lists them."""
    from tidal_actors.core.validate import check_cohort

    try:
        check_cohort(cohort, allow_community=True)
    except InvalidArgument as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    unknown: list[str] | None = None
    with inspected(data_dir_of(ctx, data_dir), at_text) as (db, at):
        rows = db.aggregate_rows(at)
        present = sorted({r[2] for r in rows if r[0] == cohort})
        if not present and cohort != COMMUNITY:
            keys, members = known_cohorts(db, at)
            if cohort not in keys and cohort not in members:
                unknown = sorted(set(keys) | set(members) | {COMMUNITY})
        # a type asked for that the cohort has no contribution of, while it has others:
        # said so with the types it has (the read time is not what is wrong)
        lacking = signal_type is not None and bool(present) and signal_type not in present
        types = [signal_type] if signal_type is not None and not lacking else present
        tops = (
            []
            if unknown is not None or lacking
            else [(t, db.top_entities(cohort, t, k, at)) for t in types]
        )
    if unknown is not None:
        close = difflib.get_close_matches(cohort, unknown, n=3)
        hint = (
            f"; did you mean {', '.join(map(repr, close))}?"
            if close
            else "; `tidal-actors inspect cohorts` lists them"
        )
        fail(
            f"invalid cohort={cohort!r}: no such cohort in {data_dir_of(ctx, data_dir)} "
            f"(no member, no contribution){hint}",
            EXIT_BAD_INPUT,
        )
    out = click.echo
    out(f"cohort {cohort} at {stamp(at)}")
    if lacking:
        out(
            f"  signal type {signal_type}: no contribution in this cohort "
            f"(its signal types: {', '.join(map(str, present))})"
        )
        return
    if not types:
        out("  no contributions")
    for t, top in tops:
        out(f"  signal type {t}: top {len(top)}")
        for rank, (entity_id, score) in enumerate(top, 1):
            out(f"    {rank:>4}  entity {entity_id:<20}  score {score!r}")
    if tops and all(score == 0.0 for _, top in tops for _, score in top):
        # nothing above 0 of a type the cohort has: most often a read time far from the
        # data (a cohort with no contribution at all, `types` empty, is not about time)
        note(
            f"no score above 0 at {stamp(at)}: scores decay with the read time, and "
            "contributions stamped after it do not count; --at TIME reads at another "
            "time (e.g. that of the last signal)"
            + (
                ""
                if at_text is not None
                else f". The default read time is {_default_at(ctx, data_dir)}"
            )
        )


def _default_at(ctx: click.Context, data_dir: Path | None) -> str:
    """Where ``inspect``'s default read time came from, in words."""
    path = data_dir_of(ctx, data_dir)
    state = store.read_state(path) if path is not None else {}
    if isinstance(state.get("last_event_ns"), int):
        return "the last event replayed into the directory"
    return "the wall clock: the directory records no last event (no replay or simulate wrote it)"


@inspect.command("manifests", context_settings={"ignore_unknown_options": True})
@click.argument("user_id", type=ID)
@_data_dir_option
@click.pass_context
def inspect_manifests(ctx: click.Context, user_id: int, data_dir: Path | None) -> None:
    """Each purge manifest of USER_ID with its entries, oldest first."""
    with inspected(data_dir_of(ctx, data_dir)) as (db, _):
        manifests = db.list_purge_manifests(user_id)
        statuses = (
            {m.purge_id: db.purge_status(m.purge_id) for m in manifests}
            if hasattr(db, "purge_status")
            else {}
        )
    out = click.echo
    out(f"user {user_id}: {plural(len(manifests), 'manifest')}")
    for m in manifests:
        out(f"manifest {m.purge_id}")
        out(f"  cohort      {m.cohort}")
        out(f"  created_at  {stamp(m.created_at_ns)}")
        out(f"  entries     {len(m.entries)}   evicted before the purge: {m.evicted}")
        if m.purge_id in statuses:
            out(f"  status      {_purge_state(statuses[m.purge_id])}")
        for e in m.entries:
            out(
                f"    entity {e.entity_id}  type {e.signal_type_id}  weight {e.weight!r}  "
                f"ts {stamp(e.timestamp_ns)}"
            )


def _purge_state(st: Any) -> str:
    if st.rematerialized:
        more = st.excluded_by_rematerialization
        return (
            f"retracted live {st.retracted_live}, re-materialized at "
            f"{stamp(st.rematerialized_at_ns)}"
            + (
                f"; the rebuild also left out {plural(more, 'record')} the log no longer "
                "held (evicted before the purge, read from the history)"
                if more
                else ""
            )
        )
    return f"retracted live {st.retracted_live}, re-materialization pending"


@inspect.command("purge", context_settings={"ignore_unknown_options": True})
@click.argument("purge_id")
@_data_dir_option
@click.pass_context
def inspect_purge(ctx: click.Context, purge_id: str, data_dir: Path | None) -> None:
    """Where purge PURGE_ID (32 hex digits, as listed by `manifests`) stands."""
    if not re.fullmatch(r"[0-9a-fA-F]{32}", purge_id):
        fail(f"invalid purge_id={purge_id!r}: must be 32 hex digits", EXIT_BAD_INPUT)
    pid = int(purge_id, 16)
    where = data_dir_of(ctx, data_dir)
    with inspected(where) as (db, _):
        try:
            st = db.purge_status(pid)
        except UnknownPurge:
            st = None
    if st is None:
        fail(f"no purge with id {purge_id.lower()} in {where}", EXIT_BAD_INPUT)
    click.echo(f"purge {st.purge_id}")
    click.echo(f"  user        {st.user_id}")
    click.echo(f"  cohort      {st.cohort}")
    click.echo(f"  state       {_purge_state(st)}")
