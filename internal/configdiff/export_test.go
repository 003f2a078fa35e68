package configdiff

// Len is the number of resources.
func (d *Dump) Len() int {
	n := 0
	for _, m := range d.res {
		n += len(m)
	}
	return n
}
