"""The on-call command: ``alert``, rules over the counter topic."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from memdiag.cli.common import err, notifier, out, settings_of


def cmd_alert(args: argparse.Namespace) -> int:
    from memdiag.alert import RuleError, parse_rule, parse_rules_file
    from memdiag.alerting import check_webhook, redacted, watch

    try:
        rules = [parse_rule(r) for r in args.rule or []]
        if args.rules:
            rules += parse_rules_file(Path(args.rules).read_text("utf-8"))
    except (RuleError, OSError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    if not rules:
        err.print(
            "[red]error:[/red] no rule: pass --rule 'followup_rate > 0.3 for 5m' or --rules FILE"
        )
        return 2
    if args.webhook and (problem := check_webhook(args.webhook)):
        err.print(f"[red]error:[/red] {escape(problem)}")
        return 2
    settings = settings_of(args)
    notifier(args)(
        f"watching {settings.topics.counters} on {settings.broker} with {len(rules)} rule(s)"
        + (f", posting to {escape(redacted(args.webhook))}" if args.webhook else "")
    )

    def show(alert: Any) -> None:
        d = alert.as_dict(settings.serve_url)
        if args.json:
            sys.stdout.write(json.dumps(d) + "\n")
            sys.stdout.flush()
            return
        colour = "red" if d["state"] == "firing" else "green"
        value = "no data" if d["value"] is None else f"{d['value']:.4g}"
        group = d.get("group")
        where = (" for " + ", ".join(f"{k}={v}" for k, v in group.items())) if group else ""
        out.print(
            f"[{colour}]{d['state'].upper():8}[/{colour}] {escape(d['rule'] + where)}  "
            f"value {value} "
            f"(window {d['window_minutes']}m ending {d['at']})"
            + (f" → {escape(d['page'])}" if d.get("page") else "")
        )

    asyncio.run(
        watch(
            settings,
            rules,
            show,
            webhook=args.webhook,
            from_beginning=args.from_beginning,
            stop_after_idle=args.stop_after_idle,
        )
    )
    return 0
