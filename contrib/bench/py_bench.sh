# Sourced by the benchmarks that drive xfer through a Python framework (bench_nixl.sh,
# bench_ray.sh): their command line and their plot.
#   py_bench_args NAME ROUNDS ARG...
#       src: the source tree; build: the first ARG unless it is an option (default build),
#       made absolute; rounds: --rounds R (default ROUNDS); out: --out DIR (default none,
#       created when given). Anything else ends the script: "NAME: unknown argument".
#   ratio_bars SVG TITLE YLABEL XTICS LEFT.dat LEFT_TITLE RIGHT.dat RIGHT_TITLE
#       with gnuplot, SVG: two bars per x (LEFT left of it, RIGHT right), each a median with
#       its range (the .dat files: x median min max), and the line at 1; XTICS is gnuplot's
#       ("label" x, ...). Without gnuplot a line says so. Returns 0 either way.
py_bench_args() {
    local name=$1
    rounds=$2
    shift 2
    src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    build=build
    if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
    build=$(cd "$build" && pwd)
    out=
    while [[ $# -gt 0 ]]; do
        case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "$name: unknown argument $1" >&2; exit 1 ;;
        esac
    done
    [[ -z $out ]] || mkdir -p "$out"
}

ratio_bars() {
    local svg=$1 title=$2 ylabel=$3 xtics=$4 left=$5 left_title=$6 right=$7 right_title=$8
    if ! command -v gnuplot >/dev/null; then
        echo "# plot skipped: no gnuplot (apt-get install gnuplot-nox)"
        return 0
    fi
    gnuplot <<GNUPLOT
set terminal svg size 800,480 dynamic noenhanced font 'sans,12' background rgb 'white'
set output '$svg'
set title "$title, $(nproc) cores"
set style fill solid 0.6
set boxwidth 0.35
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set ylabel '$ylabel'
set xtics $xtics
set key top left
plot 1 with lines lc rgb '#888888' dt 2 notitle, \
     '$left' using (\$1-0.18):2 with boxes lc 1 title '$left_title', \
     '' using (\$1-0.18):2:3:4 with yerrorbars lc 0 pt 0 notitle, \
     '$right' using (\$1+0.18):2 with boxes lc 2 title '$right_title', \
     '' using (\$1+0.18):2:3:4 with yerrorbars lc 0 pt 0 notitle
GNUPLOT
}
