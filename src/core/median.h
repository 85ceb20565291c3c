/* The median of a few measurements (steps, round trips, timing rounds). */
#ifndef LOOM_CORE_MEDIAN_H
#define LOOM_CORE_MEDIAN_H

/* Sorts v[0..n) in place and returns its median (the mean of the middle two when n is
 * even); 0 when n <= 0. */
double loom_median(double *v, int n);

#endif
