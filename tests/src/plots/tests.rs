//! Each kind of picture, drawn from a small fixed input, has what a reader
//! looks for. Set `LEASE_PLOTS_DIR` to also write them there, to look at
//! (e.g. `rsvg-convert -o x.png x.svg`).

use super::*;

/// Count the elements `<tag` of `svg`.
fn count(svg: &str, tag: &str) -> usize {
    svg.matches(&format!("<{tag}")).count()
}

/// The text of every `<text>` element.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            let raw = body[..body.find("</text>")?].trim();
            Some(
                raw.replace("&apos;", "'")
                    .replace("&quot;", "\"")
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&amp;", "&"),
            )
        })
        .collect()
}

/// The `<rect>` elements filled with `colour`.
fn rects_filled(svg: &str, colour: plotters::style::RGBColor) -> usize {
    let fill = format!("fill=\"#{:02X}{:02X}{:02X}\"", colour.0, colour.1, colour.2);
    svg.split("<rect")
        .skip(1)
        .filter(|r| r[..r.find("/>").unwrap_or(r.len())].contains(&fill))
        .count()
}

fn keep(name: &str, svg: &str) {
    if let Ok(dir) = std::env::var("LEASE_PLOTS_DIR") {
        std::fs::create_dir_all(&dir).expect("LEASE_PLOTS_DIR");
        std::fs::write(std::path::Path::new(&dir).join(name), svg).expect("LEASE_PLOTS_DIR");
    }
}

fn bar(start_ms: f64, valid_until_ms: f64, end_ms: f64, fence: i64) -> Bar {
    Bar {
        start_ms,
        valid_until_ms,
        end_ms,
        fence: Some(fence),
    }
}

/// A kill: w0 holds with fence 7 and is killed at 0; w1 takes over at 840
/// with fence 8; w2 never gets it. And a stop: w0 is paused from 0 to 2500,
/// its token is cancelled when it wakes.
fn kill() -> Timeline {
    Timeline {
        title: "PgTable · kill".to_owned(),
        fault: "SIGKILL of the holder".to_owned(),
        lifted: None,
        ttl_ms: 1000.0,
        from_ms: -500.0,
        to_ms: 1800.0,
        lanes: vec![
            Lane {
                name: "w0 #1".to_owned(),
                bars: vec![bar(-400.0, 0.0, 0.0, 7)],
                marks: vec![Mark {
                    at_ms: 0.0,
                    kind: MarkKind::Killed,
                }],
            },
            Lane {
                name: "w1 #2".to_owned(),
                bars: vec![bar(840.0, 1500.0, 1500.0, 8)],
                marks: vec![],
            },
            Lane {
                name: "w2 #3".to_owned(),
                bars: vec![],
                marks: vec![],
            },
        ],
        takeover: Some((1, 840.0)),
    }
}

fn stop() -> Timeline {
    Timeline {
        title: "Redis · stop".to_owned(),
        fault: "SIGSTOP for 2.5 ttl".to_owned(),
        lifted: Some((2500.0, "SIGCONT".to_owned())),
        ttl_ms: 1000.0,
        from_ms: -500.0,
        to_ms: 3200.0,
        lanes: vec![
            Lane {
                name: "w0 #1".to_owned(),
                bars: vec![bar(-300.0, 650.0, 2540.0, 3)],
                marks: vec![
                    Mark {
                        at_ms: 2505.0,
                        kind: MarkKind::Woke,
                    },
                    Mark {
                        at_ms: 2506.0,
                        kind: MarkKind::Cancelled,
                    },
                ],
            },
            Lane {
                name: "w1 #2".to_owned(),
                bars: vec![bar(950.0, 2000.0, 2000.0, 4)],
                marks: vec![],
            },
        ],
        takeover: Some((1, 950.0)),
    }
}

#[test]
fn a_timeline_has_a_lane_per_contender_its_bars_and_the_fault() {
    let svg = timeline_svg(&kill());
    keep("timeline-kill.svg", &svg);
    let texts = texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t == s);
    // Lanes, named.
    for lane in ["w0 #1", "w1 #2", "w2 #3"] {
        assert!(has(lane), "no lane {lane} in {texts:?}");
    }
    // Two valid bars (the killed one ends at the kill), each with its fence.
    assert_eq!(rects_filled(&svg, palette::VALID), 2 + 1, "bars + legend");
    assert!(has("fence 7") || has("7"), "{texts:?}");
    assert!(has("fence 8"), "{texts:?}");
    // The fault, the kill, the takeover measured.
    assert!(has("fault: SIGKILL of the holder"), "{texts:?}");
    assert!(has("killed"), "{texts:?}");
    assert!(has("takeover 840 ms"), "{texts:?}");
    // The time axis, labelled.
    assert!(
        has("ms after the fault was injected (ttl 1000 ms)"),
        "{texts:?}"
    );
    assert!(["-400", "0", "1000"].iter().all(|t| has(t)), "{texts:?}");
}

#[test]
fn a_timeline_shows_a_section_that_outlived_its_lease_and_the_cancellation() {
    let svg = timeline_svg(&stop());
    keep("timeline-stop.svg", &svg);
    let texts = texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t == s);
    // w0's section: valid until 650, then on without a lease until 2540.
    assert_eq!(rects_filled(&svg, palette::INVALID), 1 + 1, "bar + legend");
    assert_eq!(rects_filled(&svg, palette::VALID), 2 + 1, "bars + legend");
    assert!(has("fence 3") && has("fence 4"), "{texts:?}");
    assert!(has("woke, token cancelled"), "{texts:?}");
    assert!(has("SIGCONT"), "{texts:?}");
    assert!(has("takeover 950 ms"), "{texts:?}");
    // The legend says what the colours mean.
    assert!(has("lease no longer valid, section goes on"), "{texts:?}");
}

#[test]
fn a_timeline_marks_where_two_holders_believed_they_held() {
    let mut t = kill();
    t.title = "PgTable · steal".to_owned();
    // w0 believes until 300, w1 holds from 100: 200 ms of two holders.
    t.lanes[0].bars = vec![bar(-400.0, 300.0, 320.0, 7)];
    t.lanes[1].bars = vec![bar(100.0, 1500.0, 1500.0, 8)];
    let svg = timeline_svg(&t);
    keep("timeline-steal.svg", &svg);
    let texts = texts(&svg);
    assert!(
        texts.iter().any(|t| t == "two valid holders: 200 ms"),
        "{texts:?}"
    );
    // None where they do not intersect.
    let texts = super::tests::texts(&timeline_svg(&kill()));
    assert!(
        !texts.iter().any(|t| t.starts_with("two valid")),
        "{texts:?}"
    );
}

#[test]
fn a_timeline_without_fences_or_takeover_draws_neither() {
    let mut t = kill();
    t.takeover = None;
    for lane in &mut t.lanes {
        for bar in &mut lane.bars {
            bar.fence = None;
        }
    }
    let svg = timeline_svg(&t);
    let texts = texts(&svg);
    assert!(
        !texts
            .iter()
            .any(|t| t.starts_with("fence") || t.starts_with("takeover ")),
        "{texts:?}"
    );
}

fn samples(median: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| median * (0.8 + 0.4 * i as f64 / (n - 1) as f64))
        .collect()
}

#[test]
fn the_overhead_plot_has_a_box_per_backend_and_baseline_and_the_ratio() {
    let series = vec![
        OverheadSeries {
            label: "PgTable".to_owned(),
            floor: samples(300.0, 101),
            with_lease: samples(390.0, 101),
        },
        OverheadSeries {
            label: "Redis".to_owned(),
            floor: samples(100.0, 101),
            with_lease: samples(150.0, 101),
        },
    ];
    let svg = overhead_svg(&series);
    keep("overhead.svg", &svg);
    let texts = texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t == s);
    assert!(has("PgTable") && has("Redis"), "{texts:?}");
    // Medians of 300 → 390 and 100 → 150.
    assert!(has("×1.30") && has("×1.50"), "{texts:?}");
    assert!(has("300") && has("390"), "{texts:?}");
    // Two filled boxes per backend, plus the key's two swatches.
    let boxes = count(&svg, "rect") - 1; // the background
    assert_eq!(
        boxes,
        2 * 2 * 2 + 2 * 2,
        "fill + outline per box and swatch"
    );
    assert!(has("µs per cycle (log scale)"), "{texts:?}");
}

#[test]
fn the_handover_plot_compares_push_with_polling() {
    let series = vec![HandoverSeries {
        label: "PgTable".to_owned(),
        push: samples(5.0, 50),
        poll: samples(120.0, 50),
    }];
    let svg = handover_svg(&series);
    keep("handover.svg", &svg);
    let texts = texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t == s);
    assert!(
        has("PgTable") && has("push") && has("polling (baseline)"),
        "{texts:?}"
    );
    assert!(has("÷24"), "{texts:?}");
    assert_eq!(
        count(&svg, "rect") - 1,
        2 * 2 + 2 * 2,
        "two boxes, two swatches"
    );

    // A hand-over can end before `release()` returns: a sample of 0 has no
    // place on a log scale, but its box is still drawn (down to the axis).
    let mut push = samples(0.5, 50);
    push[..5].fill(0.0);
    let svg = handover_svg(&[HandoverSeries {
        label: "PgTable".to_owned(),
        push,
        poll: samples(120.0, 50),
    }]);
    assert_eq!(
        count(&svg, "rect") - 1,
        2 * 2 + 2 * 2,
        "two boxes, two swatches"
    );
}

#[test]
fn the_scale_plot_has_both_panels_a_line_per_series_and_log_axes() {
    let point = |leases: f64, requests: f64, cpu_ms: f64| ScalePoint {
        leases,
        requests: Some(requests),
        cpu_ms,
    };
    let series = vec![
        ScaleSeries {
            label: "PgTable".to_owned(),
            batched: true,
            points: vec![point(1000.0, 1.0, 4.0), point(10000.0, 10.0, 30.0)],
        },
        ScaleSeries {
            label: "PgTable".to_owned(),
            batched: false,
            points: vec![point(1000.0, 1000.0, 60.0), point(10000.0, 10000.0, 600.0)],
        },
        ScaleSeries {
            label: "Redis".to_owned(),
            batched: true,
            points: vec![point(1000.0, 1.0, 3.0), point(10000.0, 10.0, 20.0)],
        },
    ];
    let svg = scale_svg(&series);
    keep("scale.svg", &svg);
    let texts = texts(&svg);
    let has = |s: &str| texts.iter().any(|t| t == s);
    assert!(has("Server requests per renewal window"), "{texts:?}");
    assert!(has("CPU of the process per renewal window"), "{texts:?}");
    assert!(has("leases held (log)"), "{texts:?}");
    for key in ["PgTable batched", "PgTable unbatched", "Redis batched"] {
        assert!(has(key), "no key {key}: {texts:?}");
    }
    // A point per measurement, in both panels.
    assert_eq!(count(&svg, "circle"), 2 * 6);
    // The log axes reach both ends of the data.
    assert!(has("1000") && has("10000"), "{texts:?}");
}
