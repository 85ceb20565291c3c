/* loom plot: training curves (loss, validation loss, tokens/s) from metrics files, drawn
 * by gnuplot into a PNG. */
#ifndef LOOM_CLI_CMD_PLOT_H
#define LOOM_CLI_CMD_PLOT_H

/* argv[0] is "plot". Returns 0 on success; 2 on bad input (flags, a missing, empty or
 * malformed metrics file, an unwritable output, gnuplot not installed); 1 when gnuplot
 * itself fails. Errors are one line "loom plot: ..." on stderr. */
int loom_cmd_plot(int argc, char **argv);

#endif
