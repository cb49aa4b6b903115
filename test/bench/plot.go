package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/nvdomain/nvdomain/test/bench/placementsim"
)

var policyColors = map[string]color.RGBA{
	"nvdomain":        {R: 0x1b, G: 0x9e, B: 0x77, A: 255},
	"node-count only": {R: 0xd9, G: 0x5f, B: 0x02, A: 255},
	"random":          {R: 0x75, G: 0x70, B: 0xb3, A: 255},
	"first-fit":       {R: 0xe7, G: 0x29, B: 0x8a, A: 255},
	"bound":           {R: 0x66, G: 0x66, B: 0x66, A: 255},
}

// plotPlacement draws utilisation and cross-domain share against load, one line per policy.
func plotPlacement(sims []placementsim.Result, bounds map[float64]float64, loads []float64, path string) error {
	util, cross := plot.New(), plot.New()
	util.Title.Text, util.X.Label.Text, util.Y.Label.Text = "GPU utilisation", "offered load (% of capacity)", "busy GPU-time / capacity"
	cross.Title.Text, cross.X.Label.Text, cross.Y.Label.Text = "TP jobs spanning NVLink domains", "offered load (% of capacity)", "% of TP jobs placed"
	for _, policy := range []string{"nvdomain", "node-count only", "random", "first-fit"} {
		var u, c plotter.XYs
		for _, r := range sims {
			if r.Policy == policy {
				u = append(u, plotter.XY{X: r.Load * 100, Y: r.Utilisation})
				c = append(c, plotter.XY{X: r.Load * 100, Y: r.CrossDomainPct})
			}
		}
		for _, pl := range []struct {
			p   *plot.Plot
			xys plotter.XYs
		}{{util, u}, {cross, c}} {
			line, points, err := plotter.NewLinePoints(pl.xys)
			if err != nil {
				return err
			}
			line.Color, points.Color = policyColors[policy], policyColors[policy]
			pl.p.Add(line, points)
			pl.p.Legend.Add(policy, line, points)
		}
	}
	var b plotter.XYs
	for _, l := range loads {
		b = append(b, plotter.XY{X: l * 100, Y: bounds[l]})
	}
	bl, err := plotter.NewLine(b)
	if err != nil {
		return err
	}
	bl.Color, bl.Dashes = policyColors["bound"], []vg.Length{vg.Points(4), vg.Points(3)}
	util.Add(bl)
	util.Legend.Add("bound", bl)
	// Keep the legends off the lines: bottom right for utilisation (lines rise to the top
	// right), halfway up for the cross-domain panel (nvdomain's line sits at zero).
	util.Legend.Top, util.Legend.Left = false, false
	cross.Legend.Top, cross.Legend.Left = false, false
	cross.Legend.YOffs = vg.Points(110)
	img := vgimg.New(vg.Points(1000), vg.Points(420))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 3, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{util, cross}}, tiles, dc)
	util.Draw(canvases[0][0])
	cross.Draw(canvases[0][1])
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer f.Close()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}
