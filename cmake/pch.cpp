// The translation unit that compiles the programs' precompiled header (cmake/FsdpPrograms.cmake).
