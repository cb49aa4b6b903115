package main

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var policyColors = map[string]color.RGBA{
	policyNvdomain:    {R: 0x1b, G: 0x9e, B: 0x77, A: 255},
	policyRepin:       {R: 0x00, G: 0x5a, B: 0x32, A: 255},
	policyAny:         {R: 0x1f, G: 0x78, B: 0xb4, A: 255},
	"node-count only": {R: 0xd9, G: 0x5f, B: 0x02, A: 255},
	"random":          {R: 0x75, G: 0x70, B: 0xb3, A: 255},
	"first-fit":       {R: 0xe7, G: 0x29, B: 0x8a, A: 255},
	policyDRA:         {R: 0xa6, G: 0x76, B: 0x1d, A: 255},
	policyDRASpread:   {R: 0xe6, G: 0xab, B: 0x02, A: 255},
	"bound":           {R: 0x66, G: 0x66, B: 0x66, A: 255},
}

// minWait stands in for a zero mean wait on the log axis, which cannot show zero.
const minWait = 0.01

// plotPlacement draws, per scenario (rows), utilisation against the bound, mean wait (log
// scale: waits span five decades from 50% to 110% load) and the cross-domain share against
// load, one line per policy.
func plotPlacement(b *placementBench, path string) error {
	var grid [][]*plot.Plot
	for _, sc := range b.scenarios {
		util, wait, cross := plot.New(), plot.New(), plot.New()
		util.Title.Text, util.Y.Label.Text = sc.Name+": GPU utilisation", "busy GPU-time / capacity"
		wait.Title.Text, wait.Y.Label.Text = sc.Name+": mean wait", fmt.Sprintf("time units (log; 0 drawn at %g)", minWait)
		cross.Title.Text, cross.Y.Label.Text = sc.Name+": TP jobs across domains", "% of TP jobs placed"
		wait.Y.Scale, wait.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		for _, p := range []*plot.Plot{util, wait, cross} {
			p.X.Label.Text = "offered load (% of capacity)"
		}
		for _, policy := range placementPolicies() {
			name := policy.Name()
			var u, w, c plotter.XYs
			for _, load := range placementLoads {
				r := b.result(sc.Name, name, load)
				u = append(u, plotter.XY{X: load * 100, Y: r.Utilisation})
				w = append(w, plotter.XY{X: load * 100, Y: math.Max(r.MeanWait, minWait)})
				c = append(c, plotter.XY{X: load * 100, Y: r.CrossDomainPct})
			}
			for _, pl := range []struct {
				p   *plot.Plot
				xys plotter.XYs
			}{{util, u}, {wait, w}, {cross, c}} {
				line, points, err := plotter.NewLinePoints(pl.xys)
				if err != nil {
					return fmt.Errorf("plot %s: %w", name, err)
				}
				line.Color, points.Color = policyColors[name], policyColors[name]
				pl.p.Add(line, points)
				pl.p.Legend.Add(name, line, points)
			}
		}
		var bxy plotter.XYs
		for _, load := range placementLoads {
			bxy = append(bxy, plotter.XY{X: load * 100, Y: b.bounds[simKey{sc.Name, load}]})
		}
		bl, err := plotter.NewLine(bxy)
		if err != nil {
			return fmt.Errorf("plot bound: %w", err)
		}
		bl.Color, bl.Dashes = policyColors["bound"], []vg.Length{vg.Points(4), vg.Points(3)}
		util.Add(bl)
		util.Legend.Add("bound", bl)
		// Keep the legends off the lines: bottom right for utilisation (lines rise to the top
		// right), top left for waits (they rise to the right), and just above the domain-aware
		// policies' zero line for the cross-domain panel (the others cross for 20% and more at
		// the right).
		util.Legend.Top, util.Legend.Left = false, false
		wait.Legend.Top, wait.Legend.Left = true, true
		cross.Legend.Top, cross.Legend.Left = false, false
		cross.Legend.YOffs = vg.Points(12)
		grid = append(grid, []*plot.Plot{util, wait, cross})
	}
	img := vgimg.New(vg.Points(1500), vg.Points(float64(400*len(grid))))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(grid), Cols: 3, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for i, row := range grid {
		for j, p := range row {
			p.Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return nil
}
