//! The replay rate's page: per tool, the claims, replays and alarms of the last hour.

use super::*;
use crate::observe::replay_rate::SeriesFigures;

// ---- the replay rate ---------------------------------------------------------------------

pub(super) async fn replay_rate(who: Who, Query(Params { tool, .. }): Query<Params>) -> Answer {
    let console = &who.console;
    let tool = tool.trim();
    let figures = console
        .metrics()
        .replay_figures(&who.tenant, (!tool.is_empty()).then_some(tool));
    let all = || std::iter::once(&figures.total).chain(figures.tools.iter());
    let body = html! {
        h1 { "Replay rate" }
        p class="lead" {
            "Claims this server answered for this tenant in the last hour, a bar a minute, and \
             how many were replays of an earlier result. A healthy agent replays some: retries \
             find their first result. Many claims and not one replay usually mean callers \
             derive a new key on every retry (the alarm: at least " (figures.alarm_min_claims)
            " claims and no replay in " (span(Micros::from_duration(figures.alarm_window)))
            " of one series). Key-reuse refusals are callers sending one key for two different \
             requests. These figures are this server's alone and start empty at each start; "
            code { "ReplayRate" } " answers the same numbers over gRPC."
        }
        table {
            thead { tr {
                th { "Series" } th class="num" { "Claims (1 h)" } th class="num" { "Replays" }
                th class="num" { "Ratio" } th class="num" { "Key-reuse refusals" }
                th class="num" { "In the alarm window" } th { "Alarm" }
            } }
            tbody {
                @for series in all() {
                    tr {
                        td { (series_name(series)) }
                        td class="num" { (series.claims()) }
                        td class="num" { (series.replays()) }
                        td class="num" { (format!("{:.2}", series.ratio())) }
                        td class="num" { (series.key_reuse_refusals()) }
                        td class="num" {
                            (series.window.claims) " claims, " (series.window.replays) " replays"
                        }
                        td { @if series.alarm { b class="warn" { "ON" } } @else { "off" } }
                    }
                }
            }
        }
        h2 { "A bar a minute, the last hour" }
        div class="legend" {
            span class="l-claims" { "claims" }
            span class="l-replays" { "replays" }
            span class="l-ratio" { "replay ratio (right axis)" }
            span class="l-alarm" { "alarm on" }
            span class="l-reuse" { "key-reuse refusals" }
        }
        @for series in all() {
            @let name = series_name(series);
            h2 { (name) @if series.alarm { " " span class="warn" { "alarm on" } } }
            div class="chart" { (series_svg(series, &format!("replay rate of {name}"))) }
        }
        @if figures.tools.is_empty() {
            p class="muted" { "No claim of any tool in the last hour on this server." }
        }
    };
    respond::html(StatusCode::OK, who.page("Replay rate", Nav::Replays, body))
}

fn series_name(series: &SeriesFigures) -> String {
    if series.tool.is_empty() {
        "All tools".to_string()
    } else if series.folded {
        format!(
            "{} (tools beyond --metrics-max-tools)",
            crate::observe::replay_rate::FOLDED_TOOL
        )
    } else {
        series.tool.clone()
    }
}
