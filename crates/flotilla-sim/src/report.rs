//! The report: `summary.json`, `timeline.json` and `timeline.png` in a directory.
//!
//! The picture shows the run over virtual time in three panels sharing the time
//! axis: replicas (running, starting, placed), applications not RUNNING by
//! status, and requests per second (served, failed). Every event is a numbered
//! vertical line, coloured by what it hit, and listed at the right. Drawn with
//! plotters' bitmap backend and an embedded font (no system fonts), encoded
//! with `png`.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use plotters::{
    coord::{Shift, ranged1d::ValueFormatter, types::RangedCoordf64},
    drawing::DrawingAreaErrorKind,
    prelude::*,
    style::{FontStyle, register_font},
};

use crate::{
    Result, SimError,
    faults::Level,
    run::{Outcome, Sample, Timeline},
};

/// Picture size.
const W: u32 = 1600;
const H: u32 = 1100;
/// Width of the event list at the right.
const LEGEND_W: u32 = 360;
const FONT: &str = "sans-serif";

/// Why a part of the report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file or the directory could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The timeline could not be encoded as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The picture could not be drawn or encoded.
    #[error(transparent)]
    Picture(#[from] PictureError),
}

/// The error of plotters' bitmap backend.
pub type BitmapError = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// Why the picture could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PictureError {
    /// The embedded font is not a font plotters can load (plotters says no more).
    #[error("the embedded font could not be loaded")]
    Font,
    /// Drawing failed.
    #[error("drawing the picture: {0}")]
    Draw(#[source] DrawingAreaErrorKind<BitmapError>),
    /// PNG encoding failed.
    #[error("encoding the picture as PNG: {0}")]
    Encode(#[source] png::EncodingError),
}

/// The files a report consists of.
#[derive(Debug, Clone)]
pub struct ReportFiles {
    /// The summary as JSON.
    pub summary: PathBuf,
    /// The timeline samples and events as JSON.
    pub timeline: PathBuf,
    /// The picture.
    pub picture: PathBuf,
}

/// Write the report of `outcome` into `dir` (created if needed).
pub fn write(dir: &Path, outcome: &Outcome) -> Result<ReportFiles> {
    fs::create_dir_all(dir).map_err(|e| failed(dir, e))?;
    let files = ReportFiles {
        summary: dir.join("summary.json"),
        timeline: dir.join("timeline.json"),
        picture: dir.join("timeline.png"),
    };
    let put = |path: &Path, bytes: &[u8]| fs::write(path, bytes).map_err(|e| failed(path, e));
    put(&files.summary, outcome.summary.to_json().as_bytes())?;
    let timeline =
        serde_json::to_string(&outcome.timeline).map_err(|e| failed(&files.timeline, e))?;
    put(&files.timeline, timeline.as_bytes())?;
    let title = format!(
        "flotilla cluster simulation, seed {}: {} apps on {} nodes ({}), {}",
        outcome.summary.scenario.seed,
        outcome.summary.scenario.apps,
        outcome.summary.scenario.nodes,
        outcome.summary.scenario.strategy,
        if outcome.summary.ok() {
            "every invariant held"
        } else {
            "INVARIANTS FAILED"
        }
    );
    let png = picture(&outcome.timeline, &title).map_err(|e| failed(&files.picture, e))?;
    put(&files.picture, &png)?;
    Ok(files)
}

/// The report could not be written at `path`.
fn failed(path: &Path, why: impl Into<ReportError>) -> SimError {
    SimError::Report {
        path: path.to_owned(),
        source: why.into(),
    }
}

fn level_color(level: Level) -> RGBColor {
    match level {
        Level::ControlPlane => RGBColor(40, 90, 210),
        Level::DataPlane => RGBColor(230, 120, 0),
        Level::Process => RGBColor(200, 0, 0),
        Level::Operation => RGBColor(0, 140, 70),
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::ControlPlane => "control plane",
        Level::DataPlane => "data plane",
        Level::Process => "process",
        Level::Operation => "operation",
    }
}

/// Register the embedded font with plotters, once (every later call reports
/// how the first went).
fn register() -> std::result::Result<(), PictureError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED
        .get_or_init(|| register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if loaded {
        Ok(())
    } else {
        Err(PictureError::Font)
    }
}

/// Draw the timeline as a PNG.
pub fn picture(t: &Timeline, title: &str) -> std::result::Result<Vec<u8>, PictureError> {
    register()?;
    let mut rgb = vec![255u8; (W * H * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (W, H)).into_drawing_area();
        draw(&root, t, title).map_err(PictureError::Draw)?;
        root.present().map_err(PictureError::Draw)?;
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, W, H);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(PictureError::Encode)?;
        w.write_image_data(&rgb).map_err(PictureError::Encode)?;
    }
    Ok(out)
}

type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    t: &Timeline,
    title: &str,
) -> DrawResult<DB>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(44);
    head.draw(&Text::new(
        title.to_owned(),
        (16, 12),
        (FONT, 22).into_font().color(&BLACK),
    ))?;
    let (charts, legend) = body.split_horizontally(W - LEGEND_W);
    let panels = charts.split_evenly((3, 1));
    let tmax = t
        .samples
        .last()
        .map_or(1.0, |s| s.t)
        .max(t.marks.last().map_or(0.0, |m| m.t))
        .max(1.0);

    type Pick = fn(&Sample) -> f64;
    let replicas: Vec<(&str, RGBColor, Pick)> = vec![
        (
            "placed (holding a reservation)",
            RGBColor(120, 120, 120),
            |s| s.placed as f64,
        ),
        ("running (routed)", RGBColor(0, 120, 60), |s| {
            s.running as f64
        }),
        ("starting (in constructor)", RGBColor(40, 90, 210), |s| {
            s.starting as f64
        }),
    ];
    let area = Style {
        area_first: true,
        log: false,
    };
    panel(&panels[0], t, tmax, "replicas", &replicas, area)?;
    let apps: Vec<(&str, RGBColor, Pick)> = vec![
        (
            "not as expected (any status)",
            RGBColor(120, 120, 120),
            |s| s.known.saturating_sub(s.as_expected) as f64,
        ),
        ("DEPLOYING", RGBColor(40, 90, 210), |s| {
            status(s, "DEPLOYING")
        }),
        ("UNHEALTHY", RGBColor(220, 30, 30), |s| {
            status(s, "UNHEALTHY")
        }),
        ("DEPLOY_FAILED", RGBColor(150, 0, 160), |s| {
            status(s, "DEPLOY_FAILED")
        }),
        ("DELETING", RGBColor(0, 150, 150), |s| status(s, "DELETING")),
    ];
    let log_area = Style {
        area_first: true,
        log: true,
    };
    panel(
        &panels[1],
        t,
        tmax,
        "applications not RUNNING (log scale)",
        &apps,
        log_area,
    )?;
    let rps: Vec<(&str, RGBColor, Pick)> = vec![
        ("served / s", RGBColor(0, 120, 60), |s| s.served_per_s),
        ("retried / s", RGBColor(230, 120, 0), |s| s.retried_per_s),
        (
            "failed / s (after every retry)",
            RGBColor(220, 30, 30),
            |s| s.failed_per_s,
        ),
    ];
    let lines = Style {
        area_first: false,
        log: false,
    };
    panel(&panels[2], t, tmax, "requests per second", &rps, lines)?;
    events(&legend, t)?;
    Ok(())
}

fn status(s: &Sample, name: &str) -> f64 {
    s.apps.get(name).copied().unwrap_or(0) as f64
}

/// How a panel shows its series: the first one may be a filled area behind the
/// others; the y axis linear or logarithmic (zeros sit at the floor).
#[derive(Clone, Copy)]
struct Style {
    area_first: bool,
    log: bool,
}

/// The floor of a logarithmic axis: where zeros are drawn.
const LOG_FLOOR: f64 = 0.8;

type Series<'a> = [(&'a str, RGBColor, fn(&Sample) -> f64)];

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    t: &Timeline,
    tmax: f64,
    caption: &str,
    series: &Series<'_>,
    style: Style,
) -> DrawResult<DB>
where
    DB::ErrorType: 'static,
{
    let ymax = t
        .samples
        .iter()
        .flat_map(|s| series.iter().map(move |(_, _, f)| f(s)))
        .fold(1.0f64, f64::max);
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, (FONT, 18))
        .margin(8)
        .margin_right(16)
        .x_label_area_size(28)
        .y_label_area_size(64);
    if style.log {
        let ymax = ymax * 2.5;
        let chart = builder.build_cartesian_2d(0f64..tmax, (LOG_FLOOR..ymax).log_scale())?;
        fill(chart, t, ymax, LOG_FLOOR, series, style)
    } else {
        let ymax = ymax * 1.15;
        let chart = builder.build_cartesian_2d(0f64..tmax, 0f64..ymax)?;
        fill(chart, t, ymax, 0.0, series, style)
    }
}

fn fill<'a, DB, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    t: &Timeline,
    ymax: f64,
    floor: f64,
    series: &Series<'_>,
    style: Style,
) -> DrawResult<DB>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc("virtual time (s)")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 13))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;
    let top = if style.log { ymax / 1.6 } else { ymax };
    for (i, m) in t.marks.iter().enumerate() {
        let c = level_color(m.level);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(m.t, floor), (m.t, ymax)],
            c.mix(0.55).stroke_width(1),
        )))?;
        let y = if style.log {
            top / 2f64.powi((i % 3) as i32)
        } else {
            top * (0.97 - 0.07 * (i % 3) as f64)
        };
        chart.draw_series(std::iter::once(Text::new(
            format!("{}", i + 1),
            (m.t, y),
            (FONT, 12).into_font().color(&c),
        )))?;
    }
    if t.run_end > 0.0 {
        chart.draw_series(DashedLineSeries::new(
            vec![(t.run_end, floor), (t.run_end, ymax)],
            4,
            4,
            BLACK.mix(0.6).stroke_width(1),
        ))?;
    }
    for (k, (name, color, f)) in series.iter().enumerate() {
        let color = *color;
        let points = t.samples.iter().map(|s| (s.t, f(s).max(floor)));
        if k == 0 && style.area_first {
            chart
                .draw_series(
                    AreaSeries::new(points, floor, color.mix(0.25)).border_style(color.mix(0.6)),
                )?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 18, y + 5)], color.mix(0.35).filled())
                });
        } else {
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

fn events<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, t: &Timeline) -> DrawResult<DB>
where
    DB::ErrorType: 'static,
{
    let font = |c: RGBColor| (FONT, 14).into_font().color(&c);
    let mut y = 14;
    area.draw(&Text::new(
        "events",
        (10, y),
        (FONT, 18).into_font().color(&BLACK),
    ))?;
    y += 28;
    for level in [
        Level::ControlPlane,
        Level::DataPlane,
        Level::Process,
        Level::Operation,
    ] {
        let c = level_color(level);
        area.draw(&Rectangle::new([(10, y + 3), (24, y + 13)], c.filled()))?;
        area.draw(&Text::new(level_name(level), (32, y), font(BLACK)))?;
        y += 20;
    }
    y += 10;
    let room = (H as i32 - 44 - y - 30) / 19;
    let shown = t.marks.len().min(room.max(0) as usize);
    for (i, m) in t.marks.iter().take(shown).enumerate() {
        let c = level_color(m.level);
        area.draw(&Text::new(
            format!("{:>2}  {:>6.0}s  {}", i + 1, m.t, m.label),
            (10, y),
            font(c),
        ))?;
        y += 19;
    }
    if shown < t.marks.len() {
        area.draw(&Text::new(
            format!("... and {} more", t.marks.len() - shown),
            (10, y),
            font(BLACK),
        ))?;
        y += 19;
    }
    y += 10;
    area.draw(&Text::new(
        format!("dashed: end of the run ({:.0}s)", t.run_end),
        (10, y),
        font(BLACK),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_report_that_cannot_be_written_names_the_path_and_keeps_the_io_error() {
        let outcome = Outcome {
            summary: crate::Summary::default(),
            timeline: Timeline::default(),
        };
        let tmp = tempfile::tempdir().unwrap();
        let files = write(tmp.path(), &outcome).unwrap();
        assert_eq!(&fs::read(&files.picture).unwrap()[1..4], b"PNG");
        // Once loaded, the font stays loaded.
        assert!(register().is_ok());

        let file = tmp.path().join("summary.json");
        let e = write(&file, &outcome).unwrap_err();
        let SimError::Report { path, source } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(path, &file);
        assert!(matches!(source, ReportError::Io(_)), "{e:?}");
        assert!(e.to_string().starts_with("writing report "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
    }
}
