//! The report's charts, drawn as SVG by plotters. They hold numbers and
//! fixed labels only, never a string from the trace.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::units::{self, Decimals};

/// A line of the timeline chart.
pub struct Line<'a> {
    pub label: &'a str,
    pub color: RGBColor,
    /// (time in the chart's unit, bytes).
    pub points: Vec<(f64, f64)>,
}

/// Where the plotting area lies in the chart's pixels (for the page's
/// hover readout).
#[derive(Clone, Copy, Debug, Default)]
pub struct Area {
    pub left: i32,
    pub right: i32,
    pub top: i32,
    pub bottom: i32,
}

/// The chart's size in pixels.
pub const TIMELINE_SIZE: (u32, u32) = (1100, 400);
pub const BARS_SIZE: (u32, u32) = (1100, 300);

fn label_font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}

fn err(e: impl std::fmt::Display) -> String {
    format!("cannot draw a chart: {e}")
}

/// Live bytes over time: one line per series, a dashed marker at `marker`
/// (the peak). `x_unit` names the time unit of the points. The legend is
/// the page's (HTML), beside the image.
pub fn timeline(
    lines: &[Line],
    x_max: f64,
    x_unit: &str,
    y_max: f64,
    marker: Option<f64>,
) -> Result<(String, Area), String> {
    let mut svg = String::new();
    let area;
    {
        let root: DrawingArea<SVGBackend, Shift> =
            SVGBackend::with_string(&mut svg, TIMELINE_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let x_max = if x_max > 0.0 { x_max } else { 1.0 };
        let y_max = if y_max > 0.0 { y_max * 1.08 } else { 1.0 };
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(90)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(err)?;
        let y_fmt = |v: &f64| units::bytes(v.max(0.0) as u64, Decimals::OneBelow100);
        let x_fmt = |v: &f64| units::number(*v);
        chart
            .configure_mesh()
            .x_desc(format!("time since the start ({x_unit})"))
            .y_desc("live bytes")
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .label_style(label_font(13))
            .axis_desc_style(label_font(14))
            .light_line_style(RGBColor(236, 236, 236))
            .bold_line_style(RGBColor(210, 210, 210))
            .draw()
            .map_err(err)?;
        // The first line (the total) wider, under the others: where it
        // equals one of them, both stay visible.
        for (i, line) in lines.iter().enumerate() {
            let width = if i == 0 { 5 } else { 2 };
            chart
                .draw_series(LineSeries::new(
                    line.points.iter().copied(),
                    line.color.stroke_width(width),
                ))
                .map_err(err)?;
        }
        if let Some(t) = marker {
            let style = RGBColor(200, 30, 30).stroke_width(1);
            let dashes = 40;
            for i in (0..dashes).step_by(2) {
                let y0 = y_max * i as f64 / dashes as f64;
                let y1 = y_max * (i + 1) as f64 / dashes as f64;
                chart
                    .draw_series(std::iter::once(PathElement::new(
                        vec![(t, y0), (t, y1)],
                        style,
                    )))
                    .map_err(err)?;
            }
        }
        let (x, y) = chart.plotting_area().get_pixel_range();
        area = Area {
            left: x.start,
            right: x.end,
            top: y.start,
            bottom: y.end,
        };
        root.present().map_err(err)?;
    }
    Ok((svg, area))
}

/// A bar chart: one bar per label, `values` tall.
pub fn bars(
    labels: &[String],
    values: &[u64],
    color: RGBColor,
    y_desc: &str,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, BARS_SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = labels.len().max(1) as u32;
        let y_max = values.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(90)
            .build_cartesian_2d((0u32..n).into_segmented(), 0f64..y_max)
            .map_err(err)?;
        let x_fmt = |v: &SegmentValue<u32>| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        let y_fmt = |v: &f64| units::thousands(v.max(0.0) as u64);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(labels.len().max(1))
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .y_desc(y_desc)
            .label_style(label_font(12))
            .axis_desc_style(label_font(14))
            .light_line_style(RGBColor(236, 236, 236))
            .bold_line_style(RGBColor(210, 210, 210))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(values.iter().enumerate().map(|(i, &v)| {
                let i = i as u32;
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), v as f64),
                    ],
                    color.filled(),
                );
                bar.set_margin(0, 0, 3, 3);
                bar
            }))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
