//! The replay rate's page: per tool, the claims, replays and alarms of the last hour.

use super::*;

// ---- the replay rate ---------------------------------------------------------------------

pub(super) fn replay_rate(console: &Console, call: &Call, who: &Who) -> Answer {
    let tool = call.query.get("tool").trim();
    let figures = console
        .metrics()
        .replay_figures(&who.tenant, (!tool.is_empty()).then_some(tool));
    let mut body = String::from("<h1>Replay rate</h1>");
    let _ = write!(
        body,
        "<p class=\"lead\">Claims this server answered for this tenant in the last hour, a bar a \
         minute, and how many were replays of an earlier result. A healthy agent replays some: \
         retries find their first result. Many claims and not one replay usually mean callers \
         derive a new key on every retry (the alarm: at least {min} claims and no replay in {window} \
         of one series). Key-reuse refusals are callers sending one key for two different \
         requests. These figures are this server's alone and start empty at each start; \
         <code>ReplayRate</code> answers the same numbers over gRPC.</p>",
        min = figures.alarm_min_claims,
        window = esc(&span(Micros::from_duration(figures.alarm_window))),
    );
    let legend = "<div class=\"legend\"><span class=\"l-claims\">claims</span>\
                  <span class=\"l-replays\">replays</span><span class=\"l-ratio\">replay ratio \
                  (right axis)</span><span class=\"l-alarm\">alarm on</span>\
                  <span class=\"l-reuse\">key-reuse refusals</span></div>";
    body.push_str(
        "<table><thead><tr><th>Series</th><th class=\"num\">Claims (1 h)</th>\
         <th class=\"num\">Replays</th><th class=\"num\">Ratio</th>\
         <th class=\"num\">Key-reuse refusals</th><th class=\"num\">In the alarm window</th>\
         <th>Alarm</th></tr></thead><tbody>",
    );
    let all = std::iter::once(&figures.total).chain(figures.tools.iter());
    for series in all {
        let name = series_name(series);
        let _ = write!(
            body,
            "<tr><td>{name}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{:.2}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{} claims, {} replays</td><td>{}</td></tr>",
            series.claims(),
            series.replays(),
            series.ratio(),
            series.key_reuse_refusals(),
            series.window.claims,
            series.window.replays,
            if series.alarm {
                "<b class=\"warn\">ON</b>"
            } else {
                "off"
            },
            name = esc(&name),
        );
    }
    body.push_str("</tbody></table><h2>A bar a minute, the last hour</h2>");
    body.push_str(legend);
    let all = std::iter::once(&figures.total).chain(figures.tools.iter());
    for series in all {
        let name = series_name(series);
        let _ = write!(
            body,
            "<h2>{}{}</h2><div class=\"chart\">{}</div>",
            esc(&name),
            if series.alarm {
                " <span class=\"warn\">alarm on</span>"
            } else {
                ""
            },
            series_svg(series, &format!("replay rate of {name}"))
        );
    }
    if figures.tools.is_empty() {
        body.push_str(
            "<p class=\"muted\">No claim of any tool in the last hour on this server.</p>",
        );
    }
    respond::html(StatusCode::OK, who.page("Replay rate", Nav::Replays, &body))
}

fn series_name(series: &crate::observe::replay::SeriesFigures) -> String {
    if series.tool.is_empty() {
        "All tools".to_string()
    } else if series.folded {
        format!(
            "{} (tools beyond --metrics-max-tools)",
            crate::observe::replay::FOLDED_TOOL
        )
    } else {
        series.tool.clone()
    }
}
