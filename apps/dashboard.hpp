#pragma once
// The coordinator's dashboard (GET /): one self-contained HTML page (inline CSS and script, charts
// drawn as inline SVG by its own script, nothing loaded from elsewhere) that polls GET /status and
// GET /history about once a second and shows the nodes and their states, the pipelines and their
// stages, the loss and eval-loss curves and samples/s over the steps with reconfigurations marked.
//
// What it renders carries ids, classes and data- attributes that tests read from the DOM after the
// script ran (tests/apps/dashboard_browser_test.cpp): #nodes rows (.node, data-node, data-name,
// data-state), #pipelines (.pipeline, .stage with data-pipeline, data-stage, data-node), the charts'
// paths (#loss-chart path.series.loss and .eval, #speed-chart path.series.speed, each with
// data-points) and reconfiguration marks (line.reconfiguration, data-step), and body's data-updates
// (how many polls were rendered).

#include <string_view>

namespace oobleck::apps {

/// The page, whole.
std::string_view dashboard_html();

}  // namespace oobleck::apps
