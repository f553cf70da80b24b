// The translation unit that a precompiled-header target compiles.
