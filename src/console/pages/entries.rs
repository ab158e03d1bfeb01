//! The entries: by filter (status, tool, run, start time), and one found by key, key prefix
//! or `external_ref`.

use super::*;
use crate::domain::fields::{InvalidField, RunId, ToolName, optional};

/// A time bound of a filter: RFC 3339, or a duration before now (`15m`, `24h`, `7d`).
fn time_bound(field: &'static str, text: &str, now: Micros) -> Result<Option<Micros>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = prost_types::Timestamp::from_str(text) {
        return Ok(Some(Micros(
            t.seconds
                .saturating_mul(1_000_000)
                .saturating_add(i64::from(t.nanos / 1000)),
        )));
    }
    match crate::defaults::parse_duration(text) {
        Ok(d) => Ok(Some(now.minus(Micros::from_duration(d)))),
        Err(_) => Err(format!(
            "{field}: `{text}` is neither an RFC 3339 time (2026-11-30T06:00:00Z) nor a \
             duration ago (15m, 24h, 7d)"
        )),
    }
}

fn status_of(text: &str) -> Result<Option<Status>, String> {
    match text {
        "" | "any" => Ok(None),
        other => Status::parse(&other.to_ascii_uppercase())
            .map(Some)
            .ok_or_else(|| format!("status: `{other}` is not a state")),
    }
}

/// The filters' form, as `q` set them, and the find form; with the `problem` of a filter.
fn filters(q: &Params, problem: Option<&str>) -> Markup {
    let status = q.status.as_str();
    html! {
        form class="filters" method="get" action="/entries" {
            label {
                "Status"
                select name="status" {
                    @for s in ["any", "unknown", "attempting", "succeeded", "failed"] {
                        option value=(s)
                            selected[status.eq_ignore_ascii_case(s) || (status.is_empty() && s == "any")]
                            { (s) }
                    }
                }
            }
            label { "Tool" input type="text" name="tool" value=(q.tool.trim()); }
            label { "Run" input type="text" name="run" value=(q.run.trim()); }
            label {
                "Started since (RFC 3339 or 24h)"
                input type="text" name="since" value=(q.since);
            }
            label { "Started before" input type="text" name="until" value=(q.until); }
            button type="submit" { "Filter" }
        }
        form class="filters" method="get" action="/find" {
            label {
                "Find by key, key prefix (6+ characters) or external_ref"
                input type="text" name="q" size="70";
            }
            button type="submit" { "Find" }
        }
        @if let Some(problem) = problem { p class="flash bad" { (problem) } }
    }
}

pub(super) async fn entries(who: Who, Query(q): Query<Params>) -> PageResult {
    let console = &who.console;
    let (tool, run) = (q.tool.trim(), q.run.trim());
    let refused = |problem: &str| {
        let body = html! { h1 { "Entries" } (filters(&q, Some(problem))) };
        respond::html(
            StatusCode::BAD_REQUEST,
            who.page("Entries", Nav::Entries, body),
        )
    };
    let parsed = (|| {
        let status = status_of(&q.status)?;
        let started_after = time_bound("since", &q.since, who.now)?;
        let started_before = time_bound("until", &q.until, who.now)?;
        // Empty is no filter; a malformed one is refused as `field: message`, as the ledger's
        // refusals below.
        let field = |e: InvalidField| e.to_string();
        let run_id = optional(run, RunId::parse).map_err(field)?;
        let tool = optional(tool, ToolName::parse).map_err(field)?;
        Ok::<_, String>(ListInput {
            run_id,
            tool,
            status,
            started_after,
            started_before,
            page_size: PAGE_SIZE,
            page_token: q.page_token.clone(),
            // The possible double effects have their own section on the first page.
            possible_double_effect: false,
        })
    })();
    let input = match parsed {
        Ok(input) => input,
        Err(problem) => return Ok(refused(&problem)),
    };
    let out = match console.ledger().list_entries(&who.tenant, input).await {
        Ok(out) => out,
        Err(LedgerError::InvalidArgument { field, message, .. }) => {
            return Ok(refused(&format!("{field}: {message}")));
        }
        Err(e) => return Err(failure(&e)),
    };
    let filtered = [
        ("status", q.status.as_str()),
        ("tool", tool),
        ("run", run),
        ("since", q.since.as_str()),
        ("until", q.until.as_str()),
    ];
    let body = html! {
        h1 { "Entries" }
        p class="lead" {
            "The audit trail of this tenant, oldest attempt first, as ListEntries answers it."
        }
        (filters(&q, None))
        (entry_table(&out.entries, who.now))
        (pager("/entries", &filtered, &out.next_page_token))
    };
    Ok(respond::html(
        StatusCode::OK,
        who.page("Entries", Nav::Entries, body),
    ))
}

fn entry_table(entries: &[EntryView], now: Micros) -> Markup {
    html! {
        @if entries.is_empty() {
            div class="card" { "No entry matches." }
        } @else {
            table {
                thead { tr {
                    th { "Started" } th { "Status" } th { "Tool" } th { "Run" }
                    th class="num" { "Attempt" } th class="num" { "Replays" }
                    th { "external_ref" } th { "Key" } th { "Resolved by" }
                } }
                tbody {
                    @for view in entries {
                        @let e = &view.entry;
                        tr {
                            td title={ (span(now.minus(e.started_at))) " ago" } {
                                (time(e.started_at))
                            }
                            td { (status_badge(view.status)) }
                            td { (shorten(e.tool.as_str(), 32)) }
                            td { (shorten(e.run_id_str(), 32)) }
                            td class="num" { (e.attempt) }
                            td class="num" { (e.replay_count) }
                            td class="mono" { (view.external_ref) }
                            td class="mono" { (entry_link(e.key.as_str())) }
                            td { (e.resolved_by.as_str()) }
                        }
                    }
                }
            }
        }
    }
}

pub(super) async fn find(who: Who, Query(Params { q: text, .. }): Query<Params>) -> PageResult {
    let console = &who.console;
    let answer = |status: StatusCode, message: &str, listed: Markup| {
        let body = html! {
            h1 { "Find" }
            form class="filters" method="get" action="/find" {
                label {
                    "Key, key prefix (6+ characters) or external_ref"
                    input type="text" name="q" size="70" value=(text);
                }
                button type="submit" { "Find" }
            }
            p class="flash bad" { (message) }
            (listed)
        };
        respond::html(status, who.page("Find", Nav::Entries, body))
    };
    let query = match KeyQuery::parse(&text) {
        Ok(query) => query,
        Err(problem) => return Ok(answer(StatusCode::BAD_REQUEST, &problem, html! {})),
    };
    let verdict = console
        .ledger()
        .find(&who.tenant, &query, SEARCH_LIMIT)
        .await
        .map_err(|e| failure(&e))?;
    Ok(match verdict {
        Verdict::One(view) => respond::redirect(&entry_path(view.entry.key.as_str())),
        Verdict::Missing(why) => answer(
            StatusCode::NOT_FOUND,
            &missing_message(query.text(), why),
            html! {},
        ),
        Verdict::Cut { read, found } => answer(
            StatusCode::OK,
            &format!(
                "The search stopped after the oldest {read} entries{}: another may match further \
                 on. Give the whole key.",
                found.map_or(String::new(), |k| format!(" with one match, {k}"))
            ),
            html! {},
        ),
        Verdict::Ambiguous {
            keys,
            count,
            searched,
        } => {
            let more = if searched.is_some() { "at least " } else { "" };
            answer(
                StatusCode::OK,
                &format!(
                    "{more}{count} entries match `{}`: give more characters.",
                    query.text()
                ),
                html! {
                    ul class="mono" {
                        @for key in &keys { li { a href=(entry_path(key)) { (key) } } }
                    }
                },
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bounds_are_rfc_3339_or_a_duration_ago() {
        let now = Micros(10_000_000_000);
        assert_eq!(time_bound("since", "", now), Ok(None));
        assert_eq!(
            time_bound("since", "1970-01-01T00:00:01Z", now),
            Ok(Some(Micros(1_000_000)))
        );
        assert_eq!(
            time_bound("since", "15m", now),
            Ok(Some(Micros(10_000_000_000 - 900_000_000)))
        );
        let e = time_bound("until", "yesterday", now).expect_err("refused");
        assert!(e.starts_with("until: `yesterday`"), "{e}");
    }

    #[test]
    fn statuses_are_named_in_any_case() {
        assert_eq!(status_of(""), Ok(None));
        assert_eq!(status_of("any"), Ok(None));
        assert_eq!(status_of("unknown"), Ok(Some(Status::Unknown)));
        assert_eq!(status_of("SUCCEEDED"), Ok(Some(Status::Succeeded)));
        assert!(status_of("done").is_err());
    }
}
