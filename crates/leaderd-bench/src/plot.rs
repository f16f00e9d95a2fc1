//! SVG plots of one run, drawn from the numbers the parts return (never from
//! the printed Markdown), for `BENCHMARKS.md` and the docs.
//!
//! plotters' SVG backend only, with no font feature: the SVG carries `<text>`
//! elements and the viewer's fonts draw them, so neither the build nor the
//! run needs a font library (fontconfig, freetype) or a font file. Text
//! widths for layout are plotters' estimate, hence the generous label areas.
//!
//! It does not decide what to measure or print: the parts do.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::elections::Step;
use crate::failover::{Case, Went};
use crate::heartbeat::{kind_name, CostRow, Run, ScaleStep};
use crate::memory::{Footprint, TARGET_KIB_PER_ELECTION};
use crate::rolling::Changes;
use crate::serve::Served;
use leaderd_tests::Kind;

/// Files written into the plots directory, in the order of the parts.
pub const HEARTBEAT: &str = "heartbeat.svg";
pub const SCALE: &str = "scale.svg";
pub const FAILOVER: &str = "failover.svg";
pub const SERVE: &str = "leader-latency.svg";
pub const ELECTIONS: &str = "elections.svg";
pub const MEMORY: &str = "memory.svg";
pub const ROLLING: &str = "rolling.svg";
pub const HANDOVER: &str = "handover.svg";

const FONT: &str = "sans-serif";
/// Room for the failover plot's legend, right of the plot.
const LEGEND_WIDTH: i32 = 250;
const GREY: RGBColor = RGBColor(0x88, 0x88, 0x88);
/// Colour-blind safe (Okabe–Ito).
const BLUE: RGBColor = RGBColor(0x00, 0x72, 0xb2);
const ORANGE: RGBColor = RGBColor(0xe6, 0x9f, 0x00);
const GREEN: RGBColor = RGBColor(0x00, 0x9e, 0x73);
const VERMILION: RGBColor = RGBColor(0xd5, 0x5e, 0x00);

fn backend_colour(kind: Kind) -> RGBColor {
    match kind {
        Kind::Postgres => BLUE,
        Kind::Mysql => ORANGE,
        Kind::Sqlite => GREEN,
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Axis numbers without needless decimals: 0.2, 5, 1000.
fn number(v: f64) -> String {
    if v.abs() >= 10.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_owned()
    }
}

/// The smallest and largest of `xs`, widened by `pad` on a log scale; a
/// sane range even for one value or none.
fn log_range(xs: impl IntoIterator<Item = f64>, pad: f64) -> std::ops::Range<f64> {
    let (lo, hi) = xs
        .into_iter()
        .filter(|x| *x > 0.0 && x.is_finite())
        .fold((f64::MAX, f64::MIN_POSITIVE), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if lo > hi {
        return 0.1..1.0;
    }
    lo / pad..hi * pad
}

/// Ticks at 1, 2, 5 of every decade inside `r` (plotters' own log ticks
/// crowd the labels).
fn ticks(r: &std::ops::Range<f64>) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powf(r.start.log10().floor());
    while decade <= r.end {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= r.start && v <= r.end {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

/// A chart of the plots: an SVG, on two axes of numbers.
type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;

/// An axis of the plots: numbers, labelled with [`number`].
trait Axis: Ranged<ValueType = f64> + ValueFormatter<f64> {}

impl<T: Ranged<ValueType = f64> + ValueFormatter<f64>> Axis for T {}

/// A log-scale axis over `r`, with [`ticks`] as its labelled points.
fn log_axis(r: &std::ops::Range<f64>) -> WithKeyPoints<LogCoord<f64>> {
    r.clone().log_scale().with_key_points(ticks(r))
}

/// One series as a line with markers: solid with filled dots, or dashed with
/// hollow ones; labelled in the legend.
fn series<X: Axis, Y: Axis>(
    chart: &mut Chart<'_, X, Y>,
    points: &[(f64, f64)],
    colour: RGBColor,
    dashed: bool,
    label: &str,
) -> Result<()> {
    let line = colour.stroke_width(2);
    if dashed {
        chart
            .draw_series(DashedLineSeries::new(points.iter().copied(), 6, 4, line))?
            .label(label)
            .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 22, y)], 5, 3, line));
    } else {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), line))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], line));
    }
    let dot = if dashed {
        colour.stroke_width(2)
    } else {
        colour.filled()
    };
    // Markers only where they are measurements one can tell apart.
    if points.len() <= 20 {
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, dot)))?;
    }
    Ok(())
}

/// A horizontal reference line across the whole x range.
fn reference<X: Axis, Y: Axis>(chart: &mut Chart<'_, X, Y>, at: f64, label: &str) -> Result<()> {
    let x = chart.x_range();
    let style = VERMILION.stroke_width(1);
    chart
        .draw_series(DashedLineSeries::new(
            [(x.start, at), (x.end, at)],
            8,
            5,
            style,
        ))?
        .label(label)
        .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 22, y)], 5, 3, style));
    Ok(())
}

/// The usual grid and axes: both labelled with [`number`].
fn axes<X: Axis, Y: Axis>(chart: &mut Chart<'_, X, Y>, x_desc: &str, y_desc: &str) -> Result<()> {
    chart
        .configure_mesh()
        .max_light_lines(2)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| number(*v))
        .y_label_formatter(&|v| number(*v))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    Ok(())
}

fn legend<X: Axis, Y: Axis>(chart: &mut Chart<'_, X, Y>, at: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(GREY)
        .label_font((FONT, 13))
        .draw()?;
    Ok(())
}

/// A chart on `area` in the plots' common style: its caption, margins and
/// label areas (a caller may widen them).
fn styled<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    caption: impl AsRef<str>,
) -> ChartBuilder<'a, 'b, DB> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, (FONT, 17))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(62);
    builder
}

/// Heartbeat cost: throughput and p99 latency against electors, leaderd
/// (solid) and the seed (dashed) per backend.
pub fn heartbeat(path: &Path, rows: &[CostRow]) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let electors = log_range(rows.iter().map(|r| r.electors as f64), 1.6);
    let mut measured: Vec<f64> = rows.iter().map(|r| r.electors as f64).collect();
    measured.sort_by(f64::total_cmp);
    measured.dedup();
    let mut kinds: Vec<Kind> = rows.iter().map(|r| r.kind).collect();
    kinds.dedup();

    let top = rows
        .iter()
        .flat_map(|r| [r.leaderd.rate, r.seed.rate])
        .fold(0.0, f64::max)
        * 1.3;
    let mut chart = styled(&left, "Heartbeats per second (higher is better)").build_cartesian_2d(
        electors
            .clone()
            .log_scale()
            .with_key_points(measured.clone()),
        0.0..top.max(1.0),
    )?;
    axes(&mut chart, "electors (log scale)", "heartbeats/s")?;
    leaderd_and_seed(&mut chart, rows, &kinds, &|run| run.rate)?;

    let p99 = log_range(
        rows.iter()
            .flat_map(|r| [millis(r.leaderd.lat.p99), millis(r.seed.lat.p99)]),
        2.0,
    );
    let mut chart = styled(&right, "p99 heartbeat latency (lower is better)").build_cartesian_2d(
        electors.log_scale().with_key_points(measured),
        log_axis(&p99),
    )?;
    axes(&mut chart, "electors (log scale)", "ms (log scale)")?;
    leaderd_and_seed(&mut chart, rows, &kinds, &|run| millis(run.lat.p99))?;
    root.present().context("writing the heartbeat plot")?;
    Ok(())
}

/// Per backend, leaderd's line (solid) and the seed's (dashed) of `of`
/// against electors, and the legend.
fn leaderd_and_seed<X: Axis, Y: Axis>(
    chart: &mut Chart<'_, X, Y>,
    rows: &[CostRow],
    kinds: &[Kind],
    of: &dyn Fn(&Run) -> f64,
) -> Result<()> {
    for &kind in kinds {
        let name = short_backend(kind);
        let colour = backend_colour(kind);
        let line = |run: &dyn Fn(&CostRow) -> &Run| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.kind == kind)
                .map(|r| (r.electors as f64, of(run(r))))
                .collect()
        };
        let leaderd = line(&|r| &r.leaderd);
        series(chart, &leaderd, colour, false, &format!("leaderd, {name}"))?;
        let seed = line(&|r| &r.seed);
        series(chart, &seed, colour, true, &format!("seed, {name}"))?;
    }
    legend(chart, SeriesLabelPosition::UpperLeft)
}

fn short_backend(kind: Kind) -> &'static str {
    kind_name(kind)
        .split_whitespace()
        .next()
        .unwrap_or("database")
}

/// Scale: latency percentiles against replicas at 1 Hz with the 50 ms
/// target, and the renewals achieved against those offered.
pub fn scale(path: &Path, steps: &[ScaleStep]) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let most = steps.iter().map(|s| s.replicas).max().unwrap_or(1) as f64 * 1.08;
    let pts = |f: &dyn Fn(&ScaleStep) -> f64| -> Vec<(f64, f64)> {
        steps.iter().map(|s| (s.replicas as f64, f(s))).collect()
    };

    let lat = log_range(
        steps
            .iter()
            .flat_map(|s| [millis(s.lat.p50), millis(s.lat.max)])
            .chain([50.0]),
        2.0,
    );
    let mut chart = styled(&left, "Renewal latency, one PostgreSQL")
        .build_cartesian_2d(0.0..most, log_axis(&lat))?;
    axes(
        &mut chart,
        "replicas renewing once a second",
        "ms (log scale)",
    )?;
    series(&mut chart, &pts(&|s| millis(s.lat.max)), GREY, true, "max")?;
    series(
        &mut chart,
        &pts(&|s| millis(s.lat.p99)),
        ORANGE,
        false,
        "p99",
    )?;
    series(&mut chart, &pts(&|s| millis(s.lat.p50)), BLUE, false, "p50")?;
    reference(&mut chart, 50.0, "target: p99 < 50 ms")?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;

    let mut chart =
        styled(&right, "Renewals per second served").build_cartesian_2d(0.0..most, 0.0..most)?;
    axes(&mut chart, "replicas renewing once a second", "renewals/s")?;
    series(
        &mut chart,
        &[(0.0, 0.0), (most, most)],
        GREY,
        true,
        "offered (one per replica)",
    )?;
    series(&mut chart, &pts(&|s| s.rate), BLUE, false, "served")?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().context("writing the scale plot")?;
    Ok(())
}

/// Failover: every measured time as a dot, one row per case, with p50 and
/// p99 marks and the lease ttl; log scale, so the milliseconds of a handover
/// and the second of a crash share one axis.
pub fn failover(path: &Path, cases: &[Case], ttl: Duration) -> Result<()> {
    let ttl_ms = millis(ttl);
    dots(
        path,
        "Failover: time until another replica leads (each dot one failover)",
        cases,
        &[
            (Went::Kill, VERMILION, "SIGKILL: the lease runs out"),
            (Went::Term, BLUE, "SIGTERM: released on shutdown"),
            (Went::Release, GREEN, "leaderd release"),
            (Went::SeedStop, GREY, "seed: polling, no release"),
        ],
        (
            ttl_ms,
            format!("lease ttl {} s (default)", number(ttl_ms / 1000.0)),
        ),
    )
}

/// Graceful handover at its limit, leaderd beside ZooKeeper: every time as
/// a dot, with p50 and p99 marks and the 5 ms target.
pub fn handover(path: &Path, cases: &[Case]) -> Result<()> {
    dots(
        path,
        "Graceful handover: time until another replica leads (each dot one handover)",
        cases,
        &[
            (Went::Term, BLUE, "leaderd, SIGTERM"),
            (Went::Release, GREEN, "leaderd release"),
            (Went::ZooKeeperTerm, VERMILION, "ZooKeeper, SIGTERM"),
            (Went::ZooKeeperRelease, GREY, "ZooKeeper, lead given up"),
        ],
        (5.0, "target p50 5 ms".to_owned()),
    )
}

/// Every case's times as dots, one row per case, coloured by how it went
/// (`keys`), with p50 and p99 marks and one dashed line (`line`: where,
/// and its legend); log scale.
fn dots(
    path: &Path,
    title: &str,
    cases: &[Case],
    keys_of: &[(Went, RGBColor, &str)],
    line: (f64, String),
) -> Result<()> {
    let rows = cases.len().max(1);
    let height = 130 + 38 * rows as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let xs = log_range(
        cases
            .iter()
            .flat_map(|c| c.times.iter().map(|t| millis(*t)))
            .chain([line.0]),
        1.6,
    );
    let mut chart = styled(&root, title)
        .margin_right(LEGEND_WIDTH)
        .y_label_area_size(270)
        .build_cartesian_2d(log_axis(&xs), -0.6..rows as f64 - 0.4)?;
    chart
        .configure_mesh()
        .max_light_lines(2)
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("ms (log scale)")
        .x_label_formatter(&|v| number(*v))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    // Top row first, as in the table.
    let y_of = |i: usize| (rows - 1 - i) as f64;
    let mut keys = Vec::new();
    for &(went, colour, label) in keys_of {
        if !cases.iter().any(|c| c.went == went) {
            continue;
        }
        let dots = cases
            .iter()
            .enumerate()
            .filter(|(_, c)| c.went == went)
            .flat_map(|(i, c)| {
                c.times.iter().enumerate().map(move |(k, t)| {
                    // Spread the dots over the row (golden-ratio steps) so
                    // equal times stay visible.
                    let jitter = ((k as f64 * 0.618_033_988_7) % 1.0 - 0.5) * 0.5;
                    (millis(*t), y_of(i) + jitter)
                })
            });
        let style = colour.mix(0.55).filled();
        chart.draw_series(dots.map(|p| Circle::new(p, 3, style)))?;
        keys.push((Key::Dot(colour), label.to_owned()));
    }
    for (pick, width, label) in [(0.50, 3, "p50"), (0.99, 1, "p99")] {
        let marks = cases.iter().enumerate().filter_map(|(i, c)| {
            let s = crate::stats::Summary::of(c.times.clone());
            (s.n > 0).then(|| {
                let x = millis(if pick < 0.9 { s.p50 } else { s.p99 });
                PathElement::new(
                    vec![(x, y_of(i) - 0.38), (x, y_of(i) + 0.38)],
                    BLACK.stroke_width(width),
                )
            })
        });
        chart.draw_series(marks)?;
        keys.push((Key::Mark(width), label.to_owned()));
    }
    let style = GREY.stroke_width(1);
    chart.draw_series(DashedLineSeries::new(
        [(line.0, -0.6), (line.0, rows as f64 - 0.4)],
        6,
        4,
        style,
    ))?;
    keys.push((Key::Dashed, line.1));
    // Beside the plot, in the right margin kept for it (drawn by hand:
    // plotters' legend stays inside the plotting area).
    let (right, top) = chart.backend_coord(&(xs.end, rows as f64 - 0.4));
    for (k, (key, text)) in keys.iter().enumerate() {
        let (x, y) = (right + 24, top + 10 + 22 * k as i32);
        match *key {
            Key::Dot(colour) => root.draw(&Circle::new((x, y), 4, colour.filled()))?,
            Key::Mark(width) => root.draw(&PathElement::new(
                vec![(x, y - 7), (x, y + 7)],
                BLACK.stroke_width(width),
            ))?,
            Key::Dashed => root.draw(&DashedPathElement::new(
                vec![(x, y - 8), (x, y + 8)],
                3,
                2,
                style,
            ))?,
        }
        let left = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(text.clone(), (x + 14, y), left))?;
    }
    // The case names, drawn beside their rows in the label area.
    let label = TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, c) in cases.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(xs.start, y_of(i)));
        root.draw(&Text::new(c.what.to_owned(), (x - 10, y), label.clone()))?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A legend entry's marker in the failover plot.
#[derive(Debug, Clone, Copy)]
enum Key {
    Dot(RGBColor),
    Mark(u32),
    Dashed,
}

/// `/leader` latency by percentile, the tail spread out (x = number of
/// nines), against the 1 ms target.
pub fn serve(path: &Path, served: &Served) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let lat = &served.sorted;
    let n = lat.len();
    // Ranks spread evenly over the nines, up to the last sample.
    let max_nines = if n > 1 { (n as f64).log10() } else { 1.0 };
    let points: Vec<(f64, f64)> = (0..=400)
        .map(|k| max_nines * k as f64 / 400.0)
        .filter_map(|nines| {
            let q = 1.0 - 10f64.powf(-nines);
            let rank = ((q * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1;
            lat.get(rank).map(|d| (nines, millis(*d)))
        })
        .collect();
    let ys = log_range(points.iter().map(|p| p.1).chain([1.0]), 1.6);
    let mut chart = styled(
        &root,
        format!(
            "GET /leader latency by percentile ({} requests/s on 2 shared cores)",
            number(served.rate.round())
        ),
    )
    .build_cartesian_2d(0.0..max_nines.ceil(), log_axis(&ys))?;
    chart
        .configure_mesh()
        .max_light_lines(2)
        .x_desc("percentile")
        .x_labels(max_nines.ceil() as usize + 1)
        .y_desc("ms (log scale)")
        .x_label_formatter(&|v| percentile(*v))
        .y_label_formatter(&|v| number(*v))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    series(&mut chart, &points, BLUE, false, "latency")?;
    reference(&mut chart, 1.0, "target: p99 < 1 ms")?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().context("writing the /leader plot")?;
    Ok(())
}

/// The percentile at `nines` nines: 0 → "0", 2 → "99", 3 → "99.9".
fn percentile(nines: f64) -> String {
    let q = 100.0 * (1.0 - 10f64.powf(-nines));
    let decimals = (nines.ceil() as usize).saturating_sub(2);
    let s = format!("{q:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Several elections per daemon: statements/s and database CPU, and the
/// attempts' p99 with the 50 ms target, against elections per daemon (log
/// scale both ways).
pub fn elections(path: &Path, steps: &[Step]) -> Result<()> {
    let root = SVGBackend::new(path, (1000, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let xs = log_range(steps.iter().map(|s| s.elections as f64), 1.5);
    let pts = |f: &dyn Fn(&Step) -> f64| -> Vec<(f64, f64)> {
        steps.iter().map(|s| (s.elections as f64, f(s))).collect()
    };
    let load = log_range(
        steps
            .iter()
            .flat_map(|s| [s.statements_per_s, s.db_cpu_percent]),
        2.0,
    );
    let mut chart = styled(&left, "Database load, three daemons")
        .build_cartesian_2d(log_axis(&xs), log_axis(&load))?;
    axes(&mut chart, "elections per daemon", "per second / % (log)")?;
    series(
        &mut chart,
        &pts(&|s| s.statements_per_s),
        BLUE,
        false,
        "statements/s",
    )?;
    series(
        &mut chart,
        &pts(&|s| s.db_cpu_percent),
        ORANGE,
        false,
        "DB CPU % of a core",
    )?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    let lat = log_range(
        steps
            .iter()
            .flat_map(|s| [s.p99_ms, s.renewal_p99_ms])
            .chain([50.0]),
        2.0,
    );
    let mut chart = styled(&right, "p99: attempts, renewals")
        .build_cartesian_2d(log_axis(&xs), log_axis(&lat))?;
    axes(&mut chart, "elections per daemon", "ms (log scale)")?;
    series(&mut chart, &pts(&|s| s.p99_ms), BLUE, false, "attempts p99")?;
    series(
        &mut chart,
        &pts(&|s| s.renewal_p99_ms),
        ORANGE,
        false,
        "renewals p99",
    )?;
    reference(&mut chart, 50.0, "target: p99 < 50 ms")?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().context("writing the elections plot")?;
    Ok(())
}

/// One daemon's RSS against the elections it leads, beside the target:
/// one election's RSS plus 2 KiB for each other.
pub fn memory(path: &Path, rows: &[Footprint]) -> Result<()> {
    let root = SVGBackend::new(path, (640, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let base = rows.first().map_or(0.0, |r| r.rss_mib);
    let target = |n: usize| base + (n.saturating_sub(1)) as f64 * TARGET_KIB_PER_ELECTION / 1024.0;
    let xs = log_range(rows.iter().map(|r| r.elections as f64), 1.5);
    let ys = log_range(
        rows.iter()
            .flat_map(|r| [r.rss_mib, r.scraped_mib, r.anon_mib, target(r.elections)]),
        1.5,
    );
    let mut chart = styled(&root, "One daemon leading N elections, idle")
        .build_cartesian_2d(log_axis(&xs), log_axis(&ys))?;
    axes(&mut chart, "elections led", "RSS MiB (log)")?;
    let pts = |f: &dyn Fn(&Footprint) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (r.elections as f64, f(r))).collect()
    };
    series(&mut chart, &pts(&|r| r.rss_mib), BLUE, false, "RSS")?;
    series(
        &mut chart,
        &pts(&|r| r.scraped_mib),
        ORANGE,
        false,
        "RSS after one /metrics scrape",
    )?;
    series(
        &mut chart,
        &pts(&|r| r.anon_mib),
        GREEN,
        false,
        "of the RSS, anonymous memory",
    )?;
    series(
        &mut chart,
        &pts(&|r| target(r.elections)),
        GREY,
        true,
        "target: one election's + 2 KiB each",
    )?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    root.present().context("writing the memory plot")?;
    Ok(())
}

/// A rolling update's changes of leader: per case, one bar of the
/// election-updates that changed leader once (the least: it has to leave
/// the old pods), twice, and three times or more, as shares.
pub fn rolling(path: &Path, cases: &[Changes]) -> Result<()> {
    let rows = cases.len().max(1);
    let height = 120 + 30 * rows as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = styled(
        &root,
        "A rolling update: changes of leader per election and update",
    )
    .margin_right(LEGEND_WIDTH)
    .y_label_area_size(250)
    .build_cartesian_2d(0.0..100.0, -0.6..rows as f64 - 0.4)?;
    let labels: Vec<String> = cases.iter().map(|c| c.label.clone()).collect();
    let y_of = |i: usize| (rows - 1 - i) as f64;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("% of election-updates")
        .y_labels(rows)
        .y_label_formatter(&|y| {
            let i = rows as f64 - 1.0 - y.round();
            labels
                .get(i as usize)
                .filter(|_| i >= 0.0 && (y - y.round()).abs() < 0.01)
                .cloned()
                .unwrap_or_default()
        })
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    for (k, (colour, label)) in [
        (GREEN, "once (the least)"),
        (ORANGE, "twice"),
        (VERMILION, "three times or more"),
    ]
    .into_iter()
    .enumerate()
    {
        let bars = cases.iter().enumerate().filter_map(|(i, c)| {
            let total = c.counts.iter().sum::<usize>().max(1) as f64;
            let from = c.counts[..k].iter().sum::<usize>() as f64 * 100.0 / total;
            let to = from + c.counts[k] as f64 * 100.0 / total;
            (to > from).then(|| {
                Rectangle::new(
                    [(from, y_of(i) - 0.35), (to, y_of(i) + 0.35)],
                    colour.filled(),
                )
            })
        });
        chart
            .draw_series(bars)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::Coordinate(770, 10))
        .background_style(WHITE)
        .label_font((FONT, 12))
        .draw()?;
    root.present().context("writing the rolling-update plot")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::heartbeat::Run;
    use crate::stats::Summary;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|x| Duration::from_millis(*x)).collect()
    }

    #[test]
    fn labels() {
        assert_eq!(number(1000.0), "1000");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(0.2), "0.2");
        assert_eq!(percentile(0.0), "0");
        assert_eq!(percentile(1.0), "90");
        assert_eq!(percentile(2.0), "99");
        assert_eq!(percentile(4.0), "99.99");
    }

    /// Every plot draws from small made-up results, and from empty ones.
    #[test]
    fn every_plot_draws() {
        let dir = leaderd_tests::Scratch::new();
        let run = |r: f64, l: u64| Run {
            rate: r,
            lat: Summary::of(ms(&[l, l * 2])),
            round_trips: None,
        };
        let rows = vec![
            CostRow {
                kind: Kind::Postgres,
                electors: 1,
                leaderd: run(3000.0, 1),
                seed: run(1000.0, 2),
            },
            CostRow {
                kind: Kind::Postgres,
                electors: 32,
                leaderd: run(7000.0, 4),
                seed: run(2000.0, 16),
            },
        ];
        let steps = vec![
            ScaleStep {
                replicas: 1000,
                rate: 1000.0,
                lat: Summary::of(ms(&[1, 3])),
            },
            ScaleStep {
                replicas: 2000,
                rate: 1900.0,
                lat: Summary::of(ms(&[900, 1500])),
            },
        ];
        let cases = vec![
            Case {
                what: "leaderd, SQLite, SIGKILL",
                went: Went::Kill,
                times: ms(&[900, 1100, 1000]),
            },
            Case {
                what: "leaderd, SQLite, release",
                went: Went::Release,
                times: ms(&[5, 7]),
            },
        ];
        let served = Served {
            rate: 1000.0,
            sorted: (1..=1000).map(Duration::from_micros).collect(),
        };
        let file = |name: &str| dir.path(name);
        heartbeat(&file(HEARTBEAT), &rows).unwrap();
        scale(&file(SCALE), &steps).unwrap();
        failover(&file(FAILOVER), &cases, crate::failover::DAEMON_TTL).unwrap();
        serve(&file(SERVE), &served).unwrap();
        for name in [HEARTBEAT, SCALE, FAILOVER, SERVE] {
            let svg = std::fs::read_to_string(file(name)).unwrap();
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        }
        let svg = std::fs::read_to_string(file(FAILOVER)).unwrap();
        assert!(svg.contains("leaderd, SQLite, release"), "case names drawn");
        let changes = [
            Changes {
                label: "3×1 oldest first".into(),
                counts: [18, 2, 0],
            },
            Changes {
                label: "3×6 spread random, wait".into(),
                counts: [100, 15, 5],
            },
        ];
        rolling(&file(ROLLING), &changes).unwrap();
        let svg = std::fs::read_to_string(file(ROLLING)).unwrap();
        assert!(svg.contains("3×6 spread random, wait"), "case names drawn");
        rolling(&file("r0.svg"), &[]).unwrap();

        // Nothing measured: still a (blank) plot, not a panic.
        heartbeat(&file("h0.svg"), &[]).unwrap();
        scale(&file("s0.svg"), &[]).unwrap();
        failover(&file("f0.svg"), &[], crate::failover::DAEMON_TTL).unwrap();
        serve(
            &file("l0.svg"),
            &Served {
                rate: 0.0,
                sorted: Vec::new(),
            },
        )
        .unwrap();
    }
}
