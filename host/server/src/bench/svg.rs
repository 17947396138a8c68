//! The chart `--svg` writes: per engine, horizontal bars of tokens/s and of
//! time to first token, each with its min–max whisker. Written by hand as
//! SVG text (no font or system library: the viewer lays out the text).

use super::report::Report;
use super::stats::Summary;

/// One bar: a label and a summary.
struct Bar {
    label: String,
    value: Summary,
}

/// A panel: a title, a unit, and its bars grouped by engine.
struct Panel {
    title: String,
    unit: &'static str,
    groups: Vec<(String, Vec<Bar>)>,
}

const WIDTH: f64 = 760.0;
const LABEL_W: f64 = 230.0;
const BAR_H: f64 = 16.0;
const GAP: f64 = 4.0;
const PALETTE: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1",
];

/// `text` with XML's special characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn panels(report: &Report) -> Vec<Panel> {
    let mut tps = Panel {
        title: "Tokens per second (higher is better)".into(),
        unit: "tok/s",
        groups: vec![],
    };
    let mut ttft = Panel {
        title: "Time to first token (lower is better)".into(),
        unit: "ms",
        groups: vec![],
    };
    let ms = |s: &Summary| Summary::of(&s.samples.iter().map(|v| v * 1000.0).collect::<Vec<_>>());
    for e in &report.engines {
        let name = format!("{} on {}", e.engine, e.model.id);
        let mut t = vec![];
        for (p, s) in &e.decode_tps {
            t.push(Bar {
                label: format!("decode @{p}"),
                value: s.clone(),
            });
        }
        for (c, s) in &e.aggregate_tps {
            t.push(Bar {
                label: format!("aggregate x{c}"),
                value: s.clone(),
            });
        }
        let mut f = vec![];
        for (p, s) in &e.ttft_cold_s {
            f.extend(ms(s).map(|value| Bar {
                label: format!("cold @{p}"),
                value,
            }));
        }
        for (p, s) in &e.ttft_warm_s {
            f.extend(ms(s).map(|value| Bar {
                label: format!("warm @{p}"),
                value,
            }));
        }
        tps.groups.push((name.clone(), t));
        ttft.groups.push((name, f));
    }
    vec![tps, ttft]
}

/// The chart of `report`.
pub(crate) fn chart(report: &Report) -> String {
    let panels = panels(report);
    let mut body = String::new();
    let mut y = 30.0;
    body.push_str(&format!(
        "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">hangar bench: {}</text>\n",
        escape(&format!(
            "{} ({})",
            report.platform.platform, report.started_at
        ))
    ));
    for panel in &panels {
        y += 22.0;
        body.push_str(&format!(
            "<text x=\"10\" y=\"{y}\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
            escape(&panel.title)
        ));
        y += 8.0;
        let max = panel
            .groups
            .iter()
            .flat_map(|(_, bars)| bars.iter().map(|b| b.value.max))
            .fold(0.0f64, f64::max);
        let scale = if max > 0.0 {
            (WIDTH - LABEL_W - 90.0) / max
        } else {
            0.0
        };
        for (i, (engine, bars)) in panel.groups.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            for bar in bars {
                let s = &bar.value;
                let mid = y + BAR_H / 2.0;
                body.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
                    LABEL_W - 6.0,
                    mid + 4.0,
                    escape(&format!("{engine} · {}", bar.label))
                ));
                body.push_str(&format!(
                    "<rect x=\"{LABEL_W}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{BAR_H}\" fill=\"{color}\"><title>{}</title></rect>\n",
                    s.median * scale,
                    escape(&format!("{engine} {}: median {:.3} {} (min {:.3}, max {:.3}, n {})", bar.label, s.median, panel.unit, s.min, s.max, s.samples.len()))
                ));
                body.push_str(&format!(
                    "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{mid:.1}\" y2=\"{mid:.1}\" stroke=\"#222\" stroke-width=\"1.5\"/>\n",
                    LABEL_W + s.min * scale,
                    LABEL_W + s.max * scale
                ));
                body.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>\n",
                    LABEL_W + s.max * scale + 6.0,
                    mid + 4.0,
                    escape(&format!("{:.1} {}", s.median, panel.unit))
                ));
                y += BAR_H + GAP;
            }
            y += GAP;
        }
    }
    y += 10.0;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{y:.0}\" viewBox=\"0 0 {WIDTH} {y:.0}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape(r#"a<b & "c">"#), "a&lt;b &amp; &quot;c&quot;&gt;");
    }
}

#[cfg(test)]
mod chart_tests {
    use super::super::fixtures::{engine, model, report};
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_with_whiskers() {
        let m = model("t<1>", "1111111111111111");
        let run = report(
            true,
            16,
            vec![
                engine("a", m.clone(), &[100.0, 200.0], &[0.010, 0.020]),
                engine("b", m, &[50.0], &[0.005]),
            ],
        );
        let svg = chart(&run);
        assert!(
            svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{svg}"
        );
        assert!(svg.contains("a on t&lt;1&gt; · decode @8"), "{svg}");
        // Two panels, two engines, one bar each: four bars and whiskers.
        assert_eq!(svg.matches("<line ").count(), 4, "{svg}");
        // The largest maximum (200 tok/s) spans the bar area; a's median
        // (150) three quarters of it, b's (50) a quarter.
        let area = WIDTH - LABEL_W - 90.0;
        assert!(
            svg.contains(&format!("width=\"{:.1}\"", area * 0.75)),
            "{svg}"
        );
        assert!(
            svg.contains(&format!("width=\"{:.1}\"", area * 0.25)),
            "{svg}"
        );
        assert!(
            svg.contains(&format!("x2=\"{:.1}\"", LABEL_W + area)),
            "{svg}"
        );
    }
}
