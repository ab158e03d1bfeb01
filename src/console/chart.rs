//! The replay rate as a picture: one inline SVG per series, drawn by the server from the same
//! figures the `ReplayRate` RPC answers. Per minute: claims (grey bars) and, over them, replays
//! (blue), the ratio of the two (an orange line on its own 0–1 scale), the minutes in which the
//! alarm was on (a red band behind), and key-reuse refusals (red marks with their count on
//! top). Each minute's exact numbers are in its `<title>`, and the page's table repeats the
//! totals as text.

use maud::{Markup, html};

use super::html::time;
use crate::observe::replay_rate::SeriesFigures;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 190.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 40.0;
const TOP: f64 = 18.0;
const BOTTOM: f64 = 22.0;

/// A coordinate to a tenth.
fn at(x: f64) -> String {
    format!("{x:.1}")
}

/// The SVG of one series; `label` names it for screen readers. Every element is closed (`{}`):
/// in a page's inline SVG, the HTML parser takes a `<rect>` without its end tag as the parent
/// of what follows it, which is then not drawn.
pub fn series_svg(series: &SeriesFigures, label: &str) -> Markup {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let (base, right) = (TOP + plot_h, LEFT + plot_w);
    let n = series.buckets.len().max(1);
    let step = plot_w / n as f64;
    let max_claims = series
        .buckets
        .iter()
        .map(|b| b.claims)
        .max()
        .unwrap_or(0)
        .max(1);
    let y_of = |count: u64| TOP + plot_h - plot_h * count as f64 / max_claims as f64;
    // A minute's bar of `count` from the axis up, at `x`.
    let bar = |class: &str, fill: &str, x: f64, count: u64| {
        let y = y_of(count);
        html! {
            rect class=(class) x=(at(x + 1.0)) y=(at(y)) width=(at((step - 2.0).max(1.0)))
                height=(at(base - y)) fill=(fill) {}
        }
    };
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            width=(WIDTH) height=(HEIGHT) role="img" aria-label=(label) {
            // Axes and grid: claims on the left, the ratio on the right.
            g font-size="10" fill="#5d6675" {
                line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(base) stroke="#d8dde5" {}
                line x1=(LEFT) y1=(base) x2=(right) y2=(base) stroke="#d8dde5" {}
                line x1=(LEFT) y1=(TOP) x2=(right) y2=(TOP) stroke="#eef1f5" {}
                text x=(LEFT - 4.0) y=(TOP + 4.0) text-anchor="end" { (max_claims) }
                text x=(LEFT - 4.0) y=(base) text-anchor="end" { "0" }
                text x=(right + 4.0) y=(TOP + 4.0) { "1.0" }
                text x=(right + 4.0) y=(base) { "0" }
                text x=(LEFT) y=(HEIGHT - 6.0) { (minute_label(series, 0)) }
                text x=(right) y=(HEIGHT - 6.0) text-anchor="end" {
                    "now (" (minute_label(series, n - 1)) ")"
                }
                text x="4" y="11" { "claims/min" }
                text x=(WIDTH - 2.0) y="11" text-anchor="end" { "ratio" }
            }
            @for (i, b) in series.buckets.iter().enumerate() {
                @let x = LEFT + step * i as f64;
                g {
                    title {
                        (time(b.start)) ": " (b.claims) " claims, " (b.replays) " replays (ratio "
                        (format!("{:.2}", b.ratio())) "), " (b.key_reuse_refusals)
                        " key-reuse refusals" @if b.alarm { ", alarm on" }
                    }
                    @if b.alarm {
                        // A band behind the minute, and a strip under the axis that no bar
                        // covers.
                        rect class="alarm" x=(at(x)) y=(TOP) width=(at(step)) height=(plot_h)
                            fill="#f4c7c3" {}
                        rect x=(at(x)) y=(at(base + 1.0)) width=(at(step)) height="4"
                            fill="#b3261e" {}
                    }
                    // A transparent hit area, so the title shows on hover anywhere in the minute.
                    rect x=(at(x)) y=(TOP) width=(at(step)) height=(plot_h) fill="transparent" {}
                    @if b.claims > 0 { (bar("claims", "#c9d0da", x, b.claims)) }
                    @if b.replays > 0 { (bar("replays", "#2456a6", x, b.replays)) }
                    @if b.key_reuse_refusals > 0 {
                        @let cx = x + step / 2.0;
                        path class="reuse"
                            d={ "M" (at(cx - 4.0)) " " (at(TOP - 8.0)) " L" (at(cx + 4.0)) " "
                                (at(TOP - 8.0)) " L" (at(cx)) " " (at(TOP - 1.0)) " Z" }
                            fill="#b3261e" {}
                        text x=(at(cx)) y=(at(TOP - 9.0)) font-size="9" text-anchor="middle"
                            fill="#b3261e" { (b.key_reuse_refusals) }
                    }
                }
            }
            // The ratio, joined across consecutive minutes that had claims.
            @for run in ratio_runs(series, step, plot_h) {
                @if let [(x, y)] = run.as_slice() {
                    circle class="ratio" cx=(x) cy=(y) r="2.5" fill="#e07b00" {}
                } @else {
                    polyline class="ratio"
                        points=(run.iter().map(|(x, y)| format!("{x},{y}")).collect::<Vec<_>>().join(" "))
                        fill="none" stroke="#e07b00" stroke-width="2" {}
                }
            }
        }
    }
}

/// The ratio's points (to a tenth), one run of consecutive minutes with claims each.
fn ratio_runs(series: &SeriesFigures, step: f64, plot_h: f64) -> Vec<Vec<(String, String)>> {
    let mut runs: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (i, b) in series.buckets.iter().enumerate() {
        if b.claims == 0 {
            runs.push(Vec::new());
            continue;
        }
        let x = LEFT + step * i as f64 + step / 2.0;
        let y = TOP + plot_h - plot_h * b.ratio().clamp(0.0, 1.0);
        if let Some(run) = runs.last_mut() {
            run.push((at(x), at(y)));
        }
    }
    runs.retain(|run| !run.is_empty());
    runs
}

/// The `HH:MM` (UTC) of bucket `i`.
fn minute_label(series: &SeriesFigures, i: usize) -> String {
    series
        .buckets
        .get(i)
        .map(|b| {
            let t = time(b.start);
            t.get(11..16).unwrap_or(&t).to_string() + " UTC"
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Micros;
    use crate::observe::replay_rate::{BucketFigures, WindowTotals};

    fn series(buckets: Vec<BucketFigures>) -> SeriesFigures {
        SeriesFigures {
            tool: "t".into(),
            folded: false,
            buckets,
            window: WindowTotals::default(),
            alarm: false,
        }
    }

    fn minute(i: i64, claims: u64, replays: u64, refusals: u64, alarm: bool) -> BucketFigures {
        BucketFigures {
            start: Micros(i * 60_000_000),
            claims,
            replays,
            key_reuse_refusals: refusals,
            alarm,
        }
    }

    #[test]
    fn each_minute_is_drawn_with_its_numbers_in_its_title() {
        let svg = series_svg(
            &series(vec![
                minute(0, 4, 1, 0, false),
                minute(1, 0, 0, 2, false),
                minute(2, 3, 0, 0, true),
            ]),
            "issue_credit <&>",
        )
        .into_string();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"), "{svg}");
        assert!(
            svg.contains("aria-label=\"issue_credit &lt;&amp;&gt;\""),
            "{svg}"
        );
        assert_eq!(svg.matches("class=\"claims\"").count(), 2, "{svg}");
        assert_eq!(svg.matches("class=\"replays\"").count(), 1, "{svg}");
        assert_eq!(svg.matches("class=\"alarm\"").count(), 1, "{svg}");
        assert_eq!(svg.matches("class=\"reuse\"").count(), 1, "{svg}");
        assert!(
            svg.contains(
                "<title>1970-01-01T00:00:00Z: 4 claims, 1 replays (ratio 0.25), 0 key-reuse \
                 refusals</title>"
            ),
            "{svg}"
        );
        assert!(svg.contains("2 key-reuse refusals</title>"), "{svg}");
        assert!(svg.contains(", alarm on</title>"), "{svg}");
        // Every element closed: in a page, an unclosed one would swallow what follows.
        for element in ["rect", "line", "path", "circle", "polyline", "text", "g"] {
            assert_eq!(
                svg.matches(&format!("<{element} ")).count()
                    + svg.matches(&format!("<{element}>")).count(),
                svg.matches(&format!("</{element}>")).count(),
                "{element}: {svg}"
            );
        }
        // The two minutes with claims are not consecutive: two dots, no line.
        assert_eq!(svg.matches("<circle class=\"ratio\"").count(), 2, "{svg}");
        assert!(!svg.contains("<polyline"), "{svg}");
    }

    #[test]
    fn an_empty_series_is_a_frame_without_marks() {
        let svg = series_svg(&series(vec![minute(0, 0, 0, 0, false); 60]), "t").into_string();
        for mark in ["claims", "replays", "alarm", "reuse", "ratio"] {
            assert!(!svg.contains(&format!("class=\"{mark}\"")), "{mark}: {svg}");
        }
    }
}
