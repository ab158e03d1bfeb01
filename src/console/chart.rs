//! The replay rate as a picture: one inline SVG per series, drawn by the server from the same
//! figures the `ReplayRate` RPC answers. Per minute: claims (grey bars) and, over them, replays
//! (blue), the ratio of the two (an orange line on its own 0–1 scale), the minutes in which the
//! alarm was on (a red band behind), and key-reuse refusals (red marks with their count on
//! top). Each minute's exact numbers are in its `<title>`, and the page's table repeats the
//! totals as text.

use std::fmt::Write as _;

use super::html::{esc, time};
use crate::observe::replay::SeriesFigures;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 190.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 40.0;
const TOP: f64 = 18.0;
const BOTTOM: f64 = 22.0;

/// The SVG of one series; `label` names it for screen readers.
pub fn series_svg(series: &SeriesFigures, label: &str) -> String {
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
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
    let ratio_y = |ratio: f64| TOP + plot_h - plot_h * ratio.clamp(0.0, 1.0);
    let mut svg = String::with_capacity(16 * 1024);
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         width=\"{WIDTH}\" height=\"{HEIGHT}\" role=\"img\" aria-label=\"{}\">",
        esc(label)
    );
    // Axes and grid: claims on the left, the ratio on the right.
    let _ = write!(
        svg,
        "<g font-size=\"10\" fill=\"#5d6675\">\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#d8dde5\"/>\
         <line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#d8dde5\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{r}\" y2=\"{TOP}\" stroke=\"#eef1f5\"/>\
         <text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{max_claims}</text>\
         <text x=\"{lx}\" y=\"{b}\" text-anchor=\"end\">0</text>\
         <text x=\"{rx}\" y=\"{ty}\">1.0</text>\
         <text x=\"{rx}\" y=\"{b}\">0</text>\
         <text x=\"{LEFT}\" y=\"{ay}\">{first}</text>\
         <text x=\"{r}\" y=\"{ay}\" text-anchor=\"end\">now ({last})</text>\
         <text x=\"4\" y=\"11\">claims/min</text>\
         <text x=\"{rt}\" y=\"11\" text-anchor=\"end\">ratio</text></g>",
        b = TOP + plot_h,
        r = LEFT + plot_w,
        lx = LEFT - 4.0,
        rx = LEFT + plot_w + 4.0,
        ty = TOP + 4.0,
        ay = HEIGHT - 6.0,
        rt = WIDTH - 2.0,
        first = esc(&minute_label(series, 0)),
        last = esc(&minute_label(series, n - 1)),
    );
    for (i, b) in series.buckets.iter().enumerate() {
        let x = LEFT + step * i as f64;
        let title = format!(
            "{}: {} claims, {} replays (ratio {:.2}), {} key-reuse refusals{}",
            time(b.start),
            b.claims,
            b.replays,
            b.ratio(),
            b.key_reuse_refusals,
            if b.alarm { ", alarm on" } else { "" }
        );
        let _ = write!(svg, "<g><title>{}</title>", esc(&title));
        if b.alarm {
            // A band behind the minute, and a strip under the axis that no bar covers.
            let _ = write!(
                svg,
                "<rect class=\"alarm\" x=\"{x:.1}\" y=\"{TOP}\" width=\"{w:.1}\" height=\"{plot_h}\" \
                 fill=\"#f4c7c3\"/><rect x=\"{x:.1}\" y=\"{sy:.1}\" width=\"{w:.1}\" height=\"4\" \
                 fill=\"#b3261e\"/>",
                w = step,
                sy = TOP + plot_h + 1.0
            );
        }
        // A transparent hit area, so the title shows on hover anywhere in the minute.
        let _ = write!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{TOP}\" width=\"{w:.1}\" height=\"{plot_h}\" fill=\"transparent\"/>",
            w = step
        );
        if b.claims > 0 {
            let y = y_of(b.claims);
            let _ = write!(
                svg,
                "<rect class=\"claims\" x=\"{bx:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\" \
                 fill=\"#c9d0da\"/>",
                bx = x + 1.0,
                bw = (step - 2.0).max(1.0),
                h = TOP + plot_h - y
            );
        }
        if b.replays > 0 {
            let y = y_of(b.replays);
            let _ = write!(
                svg,
                "<rect class=\"replays\" x=\"{bx:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\" \
                 fill=\"#2456a6\"/>",
                bx = x + 1.0,
                bw = (step - 2.0).max(1.0),
                h = TOP + plot_h - y
            );
        }
        if b.key_reuse_refusals > 0 {
            let cx = x + step / 2.0;
            let _ = write!(
                svg,
                "<path class=\"reuse\" d=\"M{l:.1} {t:.1} L{r:.1} {t:.1} L{cx:.1} {tip:.1} Z\" \
                 fill=\"#b3261e\"/><text x=\"{cx:.1}\" y=\"{ly:.1}\" font-size=\"9\" \
                 text-anchor=\"middle\" fill=\"#b3261e\">{n}</text>",
                l = cx - 4.0,
                r = cx + 4.0,
                t = TOP - 8.0,
                tip = TOP - 1.0,
                ly = TOP - 9.0,
                n = b.key_reuse_refusals
            );
        }
        svg.push_str("</g>");
    }
    // The ratio, joined across consecutive minutes that had claims.
    let mut run: Vec<String> = Vec::new();
    let mut lines = String::new();
    let flush = |run: &mut Vec<String>, lines: &mut String| {
        match run.len() {
            0 => {}
            1 => {
                let mut xy = run[0].split(',');
                let (x, y) = (xy.next().unwrap_or("0"), xy.next().unwrap_or("0"));
                let _ = write!(
                    lines,
                    "<circle class=\"ratio\" cx=\"{x}\" cy=\"{y}\" r=\"2.5\" fill=\"#e07b00\"/>"
                );
            }
            _ => {
                let _ = write!(
                    lines,
                    "<polyline class=\"ratio\" points=\"{}\" fill=\"none\" stroke=\"#e07b00\" \
                     stroke-width=\"2\"/>",
                    run.join(" ")
                );
            }
        }
        run.clear();
    };
    for (i, b) in series.buckets.iter().enumerate() {
        if b.claims == 0 {
            flush(&mut run, &mut lines);
            continue;
        }
        let x = LEFT + step * i as f64 + step / 2.0;
        run.push(format!("{x:.1},{:.1}", ratio_y(b.ratio())));
    }
    flush(&mut run, &mut lines);
    svg.push_str(&lines);
    svg.push_str("</svg>");
    svg
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
    use crate::observe::replay::{BucketFigures, WindowTotals};

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
        );
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
        // The two minutes with claims are not consecutive: two dots, no line.
        assert_eq!(svg.matches("<circle class=\"ratio\"").count(), 2, "{svg}");
        assert!(!svg.contains("<polyline"), "{svg}");
    }

    #[test]
    fn an_empty_series_is_a_frame_without_marks() {
        let svg = series_svg(&series(vec![minute(0, 0, 0, 0, false); 60]), "t");
        for mark in ["claims", "replays", "alarm", "reuse", "ratio"] {
            assert!(!svg.contains(&format!("class=\"{mark}\"")), "{mark}: {svg}");
        }
    }
}
