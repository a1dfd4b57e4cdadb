// Package internal holds small helpers shared by shoal's packages (logging
// setup, test clusters). Nothing here is part of shoal's public surface.
package internal
